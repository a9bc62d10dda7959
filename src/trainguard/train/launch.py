"""`trainguard run --nproc N`: N local processes through torch.distributed's elastic launcher.

The command becomes exactly what a user would type:

    python -m torch.distributed.run --nnodes 1 --nproc-per-node N \\
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:0 --local-addr 127.0.0.1 \\
        --max-restarts R -m trainguard run RECIPE ...

so a run started with `--nproc` and one started under an external `torchrun` (with its own
multi-node rendezvous flags: `--nnodes 2 --rdzv-endpoint host:29400 --rdzv-id job1`) take the
same path: every worker reads RANK/WORLD_SIZE/LOCAL_RANK (train/world.py). The
rendezvous stays on the loopback interface (port 0: the launcher picks a free one), so a local
run opens no port to the network. With `max_restarts` > 0 the launcher restarts all workers
after a failure (a hung rank exits with status 3), and auto-resume continues from the newest
verified checkpoint: with the same or, after a restart on another machine count, a different
number of processes (the global batch does not depend on it).

The workers end with this process, however it ends (a SIGKILL included): it names itself to them
in LAUNCHER_ENV and each one watches it (util/processes.py). The command checks the process
count against the machine before calling `launch` (`util.processes.check_local_processes`).

A worker that exits or is killed is named dead (R302: its rank, this host, the signal or exit
status the agent saw) on stderr and in `Launched.dead`; the ranks that exit with status 3 are
the survivors that diagnosed it (or a hang), not dead ones.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.errors import BadInputError, ExitStatus
from trainguard.findings import Finding
from trainguard.guard.distributed.hang import dead_rank_finding
from trainguard.guard.distributed.peers import Death
from trainguard.util.processes import launcher_env


def check_launch_args(nproc: int | None, max_restarts: int) -> None:
    """BadInputError for a process count below 1 or a negative restart count."""
    if nproc is not None and nproc < 1:
        raise BadInputError(f"--nproc {nproc}: at least one process", "use --nproc 1 or more")
    if max_restarts < 0:
        raise BadInputError(f"--max-restarts {max_restarts} is negative", "use 0 or more")


def launch_argv(
    nproc: int, worker_args: Sequence[str], max_restarts: int = 0, python: str | None = None
) -> list[str]:
    """The launcher command line for `nproc` local workers running `trainguard WORKER_ARGS`."""
    check_launch_args(nproc, max_restarts)
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:0",
        "--local-addr",
        "127.0.0.1",
        "--max-restarts",
        str(max_restarts),
        "-m",
        "trainguard",
        *worker_args,
    ]


def under_launcher() -> bool:
    """True inside a torchrun worker (this process is one rank of a job)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


@dataclass
class Launched:
    """How a launched job ended: its exit status and the workers that died (R302)."""

    status: int
    dead: list[Finding] = field(default_factory=list)


def dead_workers(failures: dict[int, Any]) -> list[Finding]:
    """R302 for the failed workers (global rank -> the agent's ProcessFailure) that died. Not
    those that exited with status 3 (survivors that named a dead or hung rank), nor those the
    agent itself stopped with SIGTERM after the first failure (unless SIGTERM is all there is:
    then the first one, by time, was stopped from outside)."""
    codes = {int(rank): int(f.exitcode) for rank, f in failures.items()}
    dead = {
        r: Death.from_exitcode(c)
        for r, c in codes.items()
        if c not in (ExitStatus.HANG, -signal.SIGTERM)
    }
    if codes and all(c == -signal.SIGTERM for c in codes.values()):
        first = min(codes, key=lambda r: failures[r].timestamp)
        dead = {first: Death.from_exitcode(codes[first])}
    if not dead:
        return []
    hosts = [socket.gethostname()] * (max(dead) + 1)  # local workers: this host
    return [dead_rank_finding(dead, hosts, reporter="the launcher")]


def job_status(failures: dict[int, Any]) -> int:
    """The status of a failed job (global rank -> the agent's ProcessFailure): the first dead
    worker's (by time), else the first failure's; a signal or a status <= 0 is 1. A killed
    rank's survivors exit 3 within a second of it, and the agent may record them first; the
    job's status names the cause, the same whichever the agent saw first."""
    survivors = (ExitStatus.HANG, -signal.SIGTERM)
    dead = [f for f in failures.values() if int(f.exitcode) not in survivors]
    if not dead and any(int(f.exitcode) == ExitStatus.HANG for f in failures.values()):
        return ExitStatus.HANG  # a hang named (or a worker stopped from outside): resume
    first = min(dead or failures.values(), key=lambda f: f.timestamp)
    return int(first.exitcode) if int(first.exitcode) > 0 else ExitStatus.FINDINGS


def launch(nproc: int, worker_args: Sequence[str], max_restarts: int = 0) -> Launched:
    """Run the workers to completion in this process's elastic agent. The status: 0 when every
    worker succeeded, else `job_status` (3: a hung rank; 1: a worker died), or 130/143 when
    this process got SIGINT/SIGTERM (the agent stops the workers with it); `dead`: R302 naming
    the workers that exited or were killed."""
    if under_launcher():
        raise BadInputError(
            "--nproc given inside a torchrun worker: the job would launch itself again",
            "drop --nproc when running under torchrun (torchrun's --nproc-per-node decides)",
        )
    # The agent runs here rather than in a `python -m torch.distributed.run` child: torch is
    # imported already, and a failure's exit status comes back without parsing any output.
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    # A run started from a terminal must not leave the workers' threads fighting for cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = get_args_parser().parse_args(launch_argv(nproc, worker_args, max_restarts)[3:])
    try:
        with launcher_env():  # every worker dies with this process (util/processes.py)
            run(args)
    except ChildFailedError as e:
        sys.stderr.write(e.format_msg() + "\n")
        dead = dead_workers(e.failures)
        for f in dead:
            sys.stderr.write(f"{f.code}: {f.message}\n")
        return Launched(job_status(e.failures), dead)
    except SignalException as e:  # the agent's own handler: it has stopped the workers
        return Launched(128 + int(e.sigval))
    return Launched(0)
