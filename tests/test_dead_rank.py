"""Dead is not hung (R302), and hangs named from the run's own step times.

- 2 ranks in a user's own loop (`Guard(distributed=...)`, real gloo, forked processes): rank 1 is
  SIGKILLed; rank 0 names it dead (R302: rank 1, its host, signal 9) within seconds and exits 3,
  instead of R301 naming nobody.
- `trainguard run --nproc 2` with rank 1 SIGKILLed: the launcher names rank 1 and SIGKILL, the
  survivor names rank 1 (slow: a whole run).
- A rank hung in a 0.3 s step, default distributed settings: the derived timeouts name it
  (R301) well under a minute, not after 300 s + 60 s (slow: it waits the floors out).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from runhelpers import run_cli
from trainguard import Guard
from trainguard.config.distributed import DistributedConfig
from trainguard.errors import ExitStatus
from trainguard.train.launch import dead_workers, job_status

pytestmark = pytest.mark.xdist_group("timing-serial")

CTX = multiprocessing.get_context("fork")
KILL_AT = 5


def _init(rank: int, world: int, tmp: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp / 'store'}", rank=rank, world_size=world
    )


def _findings(path: Path) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [r for r in rows if r["kind"] == "finding"]


def _loop(rank: int, tmp: Path, config: DistributedConfig, fault, steps: int) -> None:
    guard = Guard(run_dir=tmp / f"rank{rank}", distributed=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        with guard.phase("forward", step):
            fault(rank, step)
            loss = F.mse_loss(ddp(torch.ones(3, 4)), torch.zeros(3, 1))
        with guard.phase("backward", step):
            loss.backward()  # rank 0 waits here for rank 1's gradients
        guard.step(step, loss=loss, model=model, optimizer=optimizer).raise_if_halt()
        optimizer.step()
        optimizer.zero_grad()
        guard.end_step(step, model, optimizer)
    (tmp / f"rank{rank}.json").write_text(json.dumps({"finished": True}))
    dist.destroy_process_group()


def _killed(rank: int, step: int) -> None:
    if rank == 1 and step == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)


def _killed_worker(rank: int, world: int, tmp: Path) -> None:
    _init(rank, world, tmp)
    _loop(rank, tmp, DistributedConfig(replica_check_interval=0, straggler_interval=0), _killed, 12)


def _spawn(target, world: int, tmp: Path) -> list:
    procs = [CTX.Process(target=target, args=(r, world, tmp)) for r in range(world)]
    for p in procs:
        p.start()
    return procs


def test_killed_rank_is_named_dead_with_its_signal(tmp_path: Path) -> None:
    rank0, rank1 = _spawn(_killed_worker, 2, tmp_path)
    rank0.join(120)  # generous: the machine is shared; the old code also ends (R301) quickly
    try:
        assert rank0.exitcode == 3, rank0.exitcode  # the survivor exits for a restart
        (r302,) = _findings(tmp_path / "rank0" / "guard.jsonl")
        assert r302["code"] == "R302", r302
        assert r302["rank"] == 1 and r302["where"] == socket.gethostname()
        assert r302["step"] == KILL_AT
        assert r302["data"]["dead_ranks"] == [1] and r302["data"]["signal"] == signal.SIGKILL
        assert "SIGKILL" in r302["message"] and "rank 1" in r302["message"]
        report = tmp_path / "rank0" / r302["data"]["stack_file"]
        assert json.loads(report.with_suffix(".json").read_text())["code"] == "R302"
        assert not (tmp_path / "rank0.json").exists()
    finally:
        rank1.join(10)  # reaped only now: rank 0 read its status from the zombie
        for p in (rank0, rank1):
            if p.is_alive():
                p.kill()
    assert rank1.exitcode == -signal.SIGKILL


# -- the launcher's view ------------------------------------------------------------------------
def _failure(local_rank: int, exitcode: int) -> ProcessFailure:
    return ProcessFailure(
        local_rank=local_rank, pid=1000 + local_rank, exitcode=exitcode, error_file=""
    )


def test_the_launcher_names_the_dead_worker_not_the_ones_it_stopped() -> None:
    # Rank 1 killed; rank 0 then stopped by the agent (SIGTERM): rank 1 is the dead one.
    (f,) = dead_workers({0: _failure(0, -signal.SIGTERM), 1: _failure(1, -signal.SIGKILL)})
    assert (f.code, f.rank, f.data["signal"]) == ("R302", 1, signal.SIGKILL)
    assert f.where == socket.gethostname() and "seen by the launcher" in f.message
    # A survivor that exited 3 (it named the dead rank) is not dead; an exit status is named.
    (f,) = dead_workers({0: _failure(0, 3), 1: _failure(1, 1)})
    assert (f.rank, f.data["status"], f.data["signal"]) == (1, 1, None)
    assert "exited with status 1" in f.message
    # Stopped from outside with SIGTERM and nothing else: that rank is named.
    (f,) = dead_workers({0: _failure(0, -signal.SIGTERM)})
    assert (f.rank, f.data["signal"]) == (0, signal.SIGTERM)
    assert dead_workers({0: _failure(0, 3), 1: _failure(1, 3)}) == []  # a hang: R301, not dead
    # A hang's survivor exited 3 and the agent then stopped the hung rank: nobody is dead.
    assert dead_workers({0: _failure(0, 3), 1: _failure(1, -signal.SIGTERM)}) == []


def test_a_killed_rank_sets_the_job_status_whichever_exit_the_agent_saw_first() -> None:
    """Rank 1 killed, its survivor's exit 3 recorded a second earlier: the job's status is the
    dead worker's (1), not the survivor's hang status (the agent's own first failure)."""
    survivor, killed = _failure(0, 3), _failure(1, -signal.SIGKILL)
    survivor.timestamp, killed.timestamp = 100, 101
    assert job_status({0: survivor, 1: killed}) == ExitStatus.FINDINGS
    killed.timestamp = 99
    assert job_status({0: survivor, 1: killed}) == ExitStatus.FINDINGS
    # A hang: every rank exits 3, and the job's status says so.
    assert job_status({0: _failure(0, 3), 1: _failure(1, 3)}) == ExitStatus.HANG
    # A worker stopped from outside (SIGTERM) whose survivor named it: 3, whichever came first.
    stopped, survivor = _failure(1, -signal.SIGTERM), _failure(0, 3)
    stopped.timestamp, survivor.timestamp = 100, 101
    assert job_status({0: survivor, 1: stopped}) == ExitStatus.HANG
    # A worker that exited with a status of its own (bad input) keeps it.
    assert job_status({0: _failure(0, -signal.SIGTERM), 1: _failure(1, 2)}) == 2


# -- a hang in a short step, default timeouts ------------------------------------------------
HANG_AT = 14


def _hung(rank: int, step: int) -> None:
    time.sleep(0.3)  # a 0.3 s step
    if rank == 1 and step == HANG_AT:
        time.sleep(600)  # hung: the test ends this rank


def _hung_worker(rank: int, world: int, tmp: Path) -> None:
    _init(rank, world, tmp)
    # Default timeouts (derived); only the checks that do not matter here are off.
    _loop(rank, tmp, DistributedConfig(replica_check_interval=0, straggler_interval=0), _hung, 20)


@pytest.mark.slow  # it waits out the derived timeouts' floors (15 s + 15 s)
def test_hang_in_a_short_step_is_named_well_under_a_minute(tmp_path: Path) -> None:
    rank0, rank1 = _spawn(_hung_worker, 2, tmp_path)
    try:
        # The fixed timeouts took 300 s + 60 s; the derived ones, about 30 s. 150 s bounds the
        # wait generously on a loaded machine and still tells the two apart.
        start = time.monotonic()
        rank0.join(150)
        waited = time.monotonic() - start
        assert rank0.exitcode == 3, f"rank 0 still waiting after {waited:.0f}s"
        (r301,) = _findings(tmp_path / "rank0" / "guard.jsonl")
        assert r301["code"] == "R301" and r301["rank"] == 1 and r301["step"] == HANG_AT
        assert r301["data"]["missing_ranks"] == [1]
        assert rank1.is_alive()  # hung, not dead
    finally:
        for p in (rank0, rank1):
            if p.is_alive():
                p.kill()
            p.join(10)


# -- trainguard run --nproc ----------------------------------------------------------------------
@pytest.mark.slow  # a whole two-process run
def test_run_names_the_killed_rank_and_its_signal(tiny_recipe: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["run", str(tiny_recipe), "--run-dir", str(run), "-q", "--nproc", "2"]
    res = run_cli(*args, env={"TRAINGUARD_INJECT": "kill@5:data/r1"}, timeout=400)
    assert res.returncode != 0
    # The launcher names the dead worker with the signal the agent saw.
    lines = [x for x in res.stderr.splitlines() if x.startswith("R302: ")]
    assert lines and "rank 1 (" in lines[0] and "SIGKILL (signal 9)" in lines[0], res.stderr
    assert "seen by the launcher" in lines[0]
    # The survivor may name it too, in its hang report for the next attempt, if it gets there
    # before the launcher stops it: then as dead (R302), never as a hang naming nobody (R301).
    reports = [json.loads(p.read_text()) for p in run.glob("hang-*.json")]
    assert all((r["code"], r["rank"]) == ("R302", 1) for r in reports), reports
