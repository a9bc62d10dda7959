"""`Guard(distributed=...)` in a user's own torchrun-style loop: real gloo processes (forked, so
they cost no fresh interpreters), real DDP, FSDP2 and HSDP.

- 3 ranks, DDP: a bit flipped in rank 1's weights is named by the replica check (H201), every
  rank rolls back through `guard.rollback` and ends with the same weights; the replica rollback
  count is in the guard's state. FSDP2 on a 1-D mesh has no replicas (H203, once); HSDP on a
  (replicate, shard) mesh names the corrupted rank among the ranks holding one shard.
- 2 ranks: a rank that computes 10x slower is named (H202, rank and host), then the same rank
  hangs in its forward: rank 0 names it (R301), writes its hang report and exits 3; the hung
  rank, stopped with SIGTERM as a launcher would, leaves its stacks.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainguard import Checkpointer, ElasticSampler, Guard
from trainguard.config.distributed import DistributedConfig

# timing-based (stragglers, hangs, watchdogs, doctor): one after the other on one worker under xdist
pytestmark = pytest.mark.xdist_group("timing-serial")

CTX = multiprocessing.get_context("fork")


def _init(rank: int, world: int, tmp: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp / 'store'}", rank=rank, world_size=world
    )


def _flip(t: torch.Tensor) -> None:
    with torch.no_grad():
        t.view(-1)[0:1].view(torch.int32)[0] ^= 1 << 12  # a mantissa bit: no loss would notice


def _finish(tmp: Path, rank: int, result: dict) -> None:
    (tmp / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


# -- replicas ----------------------------------------------------------------------------------
def _replica_worker(rank: int, world: int, tmp: Path) -> None:
    _init(rank, world, tmp)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    config = DistributedConfig(replica_check_interval=2, straggler_interval=0)
    guard = Guard(run_dir=tmp / f"rank{rank}", distributed=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = ElasticSampler(60, global_batch_size=6, seed=1)  # rank and world from dist
    data = torch.randn(60, 4, generator=torch.Generator().manual_seed(0))
    state = {"model": model, "optimizer": optimizer, "sampler": sampler, "guard": guard}
    checkpointer = Checkpointer(tmp / "checkpoints")  # collective: rank 0 writes, all read
    checkpointer.save(0, state)
    decisions, step, flipped = [], 0, False
    while step < 8:
        x = data[torch.from_numpy(sampler.rank_ids(step))]
        with guard.phase("forward", step):
            loss = ddp(x).pow(2).mean()
        with guard.phase("backward", step):
            loss.backward()
        decision = guard.step(step, loss=loss, model=model, optimizer=optimizer)
        decision.raise_if_halt()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 1 and step == 2 and not flipped:
            _flip(model.weight.data)  # silent corruption after the update of step 2
            flipped = True
        end = guard.end_step(step, model, optimizer)
        decisions.append([step, end.action, [f.to_dict() for f in end.findings]])
        if end.action == "rollback":
            step = guard.rollback(checkpointer, state, sampler)
            continue
        step += 1
        if step % 4 == 0:
            checkpointer.save(step, state)
    weights = [p.detach().clone() for p in model.parameters()]
    gathered = [None] * world
    dist.all_gather_object(gathered, [w.tolist() for w in weights])
    slices = [None] * world
    dist.all_gather_object(slices, sampler.rank_ids(5).tolist())
    result = {
        "assembled": sum(slices, []) == sampler.batch_ids(5).tolist(),
        "decisions": decisions,
        "replica_rollbacks": guard.state_dict()["distributed"]["replica_rollbacks"],
        "same_weights": all(g == gathered[0] for g in gathered),
    }
    # FSDP2 on a 1-D mesh: every rank holds another shard, nothing to compare.
    part = guard.distributed
    sharded = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 3))
    fully_shard(sharded, mesh=init_device_mesh("cpu", (world,)))
    result["fsdp"] = [[f.to_dict() for f in part.check_replicas(k, sharded)] for k in (0, 2)]
    # HSDP on a (replicate, shard) mesh: the replicas of each shard are compared.
    torch.manual_seed(0)
    hsdp = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 3))
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
    fully_shard(hsdp, mesh=mesh)
    clean = part.check_replicas(4, hsdp)
    if rank == 1:
        _flip(next(hsdp.parameters()).to_local())
    result["hsdp"] = [[f.to_dict() for f in x] for x in (clean, part.check_replicas(6, hsdp))]
    guard.close()
    _finish(tmp, rank, result)


def _spawn(target, world: int, tmp: Path) -> list:
    procs = [CTX.Process(target=target, args=(r, world, tmp)) for r in range(world)]
    for p in procs:
        p.start()
    return procs


def test_replica_corruption_is_named_and_rolled_back_ddp_fsdp2_hsdp(tmp_path: Path) -> None:
    procs = _spawn(_replica_worker, 3, tmp_path)
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    host = socket.gethostname()
    for res in results:  # every rank decided the same
        assert res["decisions"] == results[0]["decisions"]
        assert res["same_weights"] and res["replica_rollbacks"] == 1
        assert res["assembled"]  # the ranks' slices (rank, world from torch.distributed)
    flagged = [(s, a, fs) for s, a, fs in results[0]["decisions"] if fs]
    assert [(s, a) for s, a, _ in flagged] == [(2, "rollback")]  # the check right after the flip
    (h201,) = flagged[0][2]
    assert h201["code"] == "H201" and h201["rank"] == 1 and h201["where"] == host
    assert h201["data"]["suspect_ranks"] == [1] and h201["data"]["replica_set"] == [0, 1, 2]
    # After the rollback to step 0 the replicas agree at every check, to the end.
    assert [d[0] for d in results[0]["decisions"]] == [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7]
    rows = [json.loads(x) for x in (tmp_path / "rank1" / "guard.jsonl").read_text().splitlines()]
    assert [(r["from_step"], r["to_step"]) for r in rows if r["kind"] == "event"] == [(2, 0)]

    fsdp_first, fsdp_again = results[0]["fsdp"]
    assert [f["code"] for f in fsdp_first] == ["H203"] and fsdp_again == []  # said once
    assert fsdp_first[0]["severity"] == "info"
    hsdp_clean, hsdp_flipped = results[2]["hsdp"]
    assert hsdp_clean == []
    assert [(f["code"], f["rank"]) for f in hsdp_flipped] == [("H201", 1)]


# -- stragglers and hung ranks -----------------------------------------------------------------
SLOW_FROM, HANG_AT = 10, 16


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:  # busy: a slow chip, not an idle one
        pass


def _slow_then_hung_worker(rank: int, world: int, tmp: Path) -> None:
    _init(rank, world, tmp)
    config = DistributedConfig(
        replica_check_interval=0,
        straggler_interval=2,
        collective_timeout_s=4,
        hang_timeout_s=4,
    )
    guard = Guard(run_dir=tmp / f"rank{rank}", distributed=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(HANG_AT + 4):
        with guard.phase("forward", step):
            _burn(0.005)
            if rank == 1 and step >= SLOW_FROM:
                _burn(0.06)
            if rank == 1 and step == HANG_AT:
                time.sleep(300)  # hung: the test stops this rank with SIGTERM
            loss = F.mse_loss(ddp(torch.ones(3, 4)), torch.zeros(3, 1))
        with guard.phase("backward", step):
            loss.backward()  # rank 0 waits here for the hung rank's gradients
        guard.step(step, loss=loss, model=model, optimizer=optimizer).raise_if_halt()
        optimizer.step()
        optimizer.zero_grad()
        guard.end_step(step, model, optimizer)
    _finish(tmp, rank, {"finished": True})


def test_slow_rank_then_hung_rank_are_named(tmp_path: Path) -> None:
    rank0, rank1 = _spawn(_slow_then_hung_worker, 2, tmp_path)
    rank0.join(180)
    assert rank0.exitcode == 3  # the hung-rank exit, for a restart
    time.sleep(0.5)
    assert rank1.is_alive()  # still asleep in its forward
    os.kill(rank1.pid, 15)  # what a launcher does to the job's other ranks
    rank1.join(30)
    host = socket.gethostname()

    rows = [json.loads(x) for x in (tmp_path / "rank0" / "guard.jsonl").read_text().splitlines()]
    findings = [r for r in rows if r["kind"] == "finding"]
    assert [f["code"] for f in findings] == ["H202", "R301"], findings
    h202, r301 = findings
    assert h202["rank"] == 1 and h202["where"] == host and h202["severity"] == "warning"
    assert SLOW_FROM <= h202["step"] <= SLOW_FROM + 6  # behind in 5 steps in a row, then named
    assert r301["rank"] == 1 and r301["step"] == HANG_AT and r301["where"] == host
    assert r301["data"]["missing_ranks"] == [1] and r301["data"]["exit_status"] == 3
    report = tmp_path / "rank0" / r301["data"]["stack_file"]
    assert "_slow_then_hung_worker" in report.read_text()  # rank 0's own stacks
    assert json.loads(report.with_suffix(".json").read_text())["code"] == "R301"
    (stacks,) = (tmp_path / "rank1").glob("stacks-rank1-*.txt")
    assert "_slow_then_hung_worker" in stacks.read_text()  # where the hung rank was
    assert not (tmp_path / "rank0.json").exists()
