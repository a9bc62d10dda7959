"""Stragglers (H202) in a real 2-process gloo DDP loop through `Guard(distributed=...)`: a rank
that sleeps in its data phase from the first step (a slow loader, storage) is named within a
few steps, as waiting, in its data phase; rank 0, which waits for it in the all-reduce, is not.
Before, a rank slow from the start was never named (no history of it being fast) and a sleeping
rank never (no CPU time)."""

from __future__ import annotations

import json
import multiprocessing
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainguard import Guard
from trainguard.config.distributed import DistributedConfig

# timing-based (stragglers, hangs, watchdogs, doctor): one after the other on one worker under xdist
pytestmark = pytest.mark.xdist_group("timing-serial")

CTX = multiprocessing.get_context("fork")
STEPS, SLEEP_S = 12, 0.15  # the sleep: many times this model's step, even on a loaded machine


def _sleepy_data_worker(rank: int, tmp: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=rank, world_size=2)
    config = DistributedConfig(replica_check_interval=0, straggler_interval=2)
    guard = Guard(run_dir=tmp / f"rank{rank}", distributed=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        with guard.phase("data", step):
            if rank == 1:
                time.sleep(SLEEP_S)  # a slow loader: no CPU time spent
            batch = torch.ones(3, 4)
        with guard.phase("forward", step):
            loss = F.mse_loss(ddp(batch), torch.zeros(3, 1))
        with guard.phase("backward", step):
            loss.backward()  # rank 0 waits here for rank 1's gradients
        guard.step(step, loss=loss, model=model, optimizer=optimizer).raise_if_halt()
        with guard.phase("optimizer", step):
            optimizer.step()
            optimizer.zero_grad()
        guard.end_step(step, model, optimizer)
    guard.close()
    dist.destroy_process_group()


def test_a_rank_sleeping_in_its_data_phase_from_step_0_is_named(tmp_path: Path) -> None:
    procs = [CTX.Process(target=_sleepy_data_worker, args=(r, tmp_path)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    for rank in range(2):  # every rank gathers the same timings and names the same rank
        rows = (tmp_path / f"rank{rank}" / "guard.jsonl").read_text().splitlines()
        found = [r for r in map(json.loads, rows) if r.get("code") == "H202"]
        assert [(f["rank"], f["where"]) for f in found] == [(1, socket.gethostname())], found
        (h202,) = found
        # Warm-up is steps 0-1; behind in the 5 steps 2-6 (`straggler_steps`): named at step 6.
        assert h202["step"] <= 8
        data = h202["data"]
        assert (data["rank"], data["phase"], data["kind"]) == (1, "data", "waiting")
        assert data["behind_s"] >= 0.5 * SLEEP_S and data["busy_s"] < 0.5 * SLEEP_S
