"""The one rule for local process counts (util/processes.py; issue 26 item 8, issue 23 item 9):
no more processes than cores, nor than the memory holds at PROCESS_MEMORY each, unless
--oversubscribe. Each command's refusal is a row of tests/test_bad_input_matrix.py; here the
rule itself, on stated machines (the memory branch cannot be provoked on this one)."""

from __future__ import annotations

import os

import pytest

from trainguard.errors import BadInputError, ExitStatus
from trainguard.util.processes import (
    PROCESS_MEMORY,
    Machine,
    available_cores,
    check_local_processes,
)


def fewer(n: int) -> str:
    return f"use --nproc {n} or fewer"


def test_up_to_the_cores_is_accepted_and_one_more_refused_naming_the_fix() -> None:
    machine = Machine(cores=4, memory=64 * PROCESS_MEMORY)
    check_local_processes(4, "--nproc 4", fewer, machine=machine)
    with pytest.raises(BadInputError) as e:
        check_local_processes(5, "--nproc 5", fewer, machine=machine)
    assert e.value.exit_status == ExitStatus.BAD_INPUT
    assert "--nproc 5 would start 5 local processes" in e.value.message
    assert "4 CPU core(s)" in e.value.message and "Nothing was started" in e.value.message
    assert e.value.fix.startswith("use --nproc 4 or fewer") and "--oversubscribe" in e.value.fix


def test_memory_for_fewer_processes_than_cores_is_refused_too() -> None:
    machine = Machine(cores=64, memory=3 * PROCESS_MEMORY + 1)
    assert machine.fits() == 3
    with pytest.raises(BadInputError) as e:
        check_local_processes(8, "--nproc 8", fewer, machine=machine)
    assert "GiB" in e.value.message and "memory" in e.value.message
    assert e.value.fix.startswith("use --nproc 3 or fewer")


def test_oversubscribe_starts_them_anyway_and_unknown_memory_counts_cores_only() -> None:
    tight = Machine(cores=1, memory=PROCESS_MEMORY)
    check_local_processes(100_000, "--nproc 100000", fewer, oversubscribe=True, machine=tight)
    unknown = Machine(cores=8, memory=None)
    assert unknown.fits() == 8 and unknown.too_many(8) is None and unknown.too_many(9)


def test_this_machine_has_at_least_one_core() -> None:
    assert 1 <= available_cores() <= len(os.sched_getaffinity(0))
