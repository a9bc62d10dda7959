"""trainguard.Checkpointer across real torch.distributed processes (gloo on CPU, FSDP2, DCP):
per-rank RNG states, async sharded saves where one rank's disk fills or one rank dies, a
damaged shard of one rank, resharding 2 -> 1 (default run) and 1 -> 2 (slow), and sharded
checkpoints on an S3 server that throttles (retries counted by the server) read once per node
(slow)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ckpt_workers import full_hashes, run_ranks, tiny_model, train_step
from trainguard import Checkpointer
from trainguard.checkpoint.rng import derived_seed, seed_all


@pytest.fixture(autouse=True)
def rng_guard():
    """Loading in this process restores its generators: give them back afterwards."""
    t, r, n = torch.get_rng_state(), random.getstate(), np.random.get_state()
    yield
    torch.set_rng_state(t)
    random.setstate(r)
    np.random.set_state(n)


def ok(result: dict) -> dict:
    assert "error" not in result, result.get("error")
    return result


def test_sharded_faults_and_resume_on_fewer_ranks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r0, r1 = run_ranks("local_faults", 2, tmp_path)
    ok(r0)
    # Non-sharded, replicated state: every rank gets its own generator states back.
    for r in (r0, r1):
        assert r["draw_after_load"] == r["draw_after_save"]
    assert r0["draw_after_save"] != r1["draw_after_save"]
    # A full disk on rank 1 fails step 3 on every rank, naming rank 1's error.
    for r in (r0, r1):
        assert "C106" in r["full_disk_error"] and "rank 1: a file grew past" in r["full_disk_error"]
    # Rank 1 killed after writing its shards of step 4: rank 0 raises instead of committing.
    assert r1["exitcode"] == -9 and "C123" in r0["dead_rank_error"]
    root = tmp_path / "sharded"
    assert sorted(p.name for p in root.iterdir()) == ["step-1", "step-2"]  # no temp folder left

    # One process resumes the 2-rank checkpoint (DCP reshards it into a plain module): the
    # state each async save captured, not what training did while it was written.
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = {"model": model, "optim": opt, "progress": {}}
    assert Checkpointer(root).load_latest(state) == 2
    assert full_hashes(model, opt) == r0["hashes"]["2"] and state["progress"] == {"epoch": 2}

    # Rank 1's shard of step 2 is damaged: the resume falls back to step 1 and the finding
    # names rank 1's file.
    shard = root / "step-2" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = {"model": model, "optim": opt, "progress": {}}
    ckpt = Checkpointer(root)
    with caplog.at_level("INFO", logger="trainguard.checkpoint"):
        assert ckpt.load_latest(state) == 1
    by_code = {f.code: f for f in ckpt.last_findings}
    assert by_code["C101"].rank == 1 and "__1_0.distcp" in by_code["C101"].message
    assert by_code["C121"].data == {"saved_world_size": 2, "world_size": 1}
    assert any("__1_0.distcp" in rec.getMessage() for rec in caplog.records)
    assert full_hashes(model, opt) == r0["hashes"]["1"] and state["progress"] == {"epoch": 1}


@pytest.mark.slow  # ~12 s; resharding 2 -> 1 runs by default in the test above
def test_resume_on_more_ranks_reshards_and_derives_rng(tmp_path: Path) -> None:
    torch.manual_seed(42)  # the run's seed: the new rank's generators derive from it
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_step(model, opt, 1)
    base_seed = torch.initial_seed()
    Checkpointer(tmp_path / "one", sharded=True).save(
        3, {"model": model, "optim": opt, "progress": {"epoch": 2}}
    )
    saved = full_hashes(model, opt)
    r0, r1 = (ok(r) for r in run_ranks("reshard_load", 2, tmp_path, root=str(tmp_path / "one")))
    assert r0["step"] == r1["step"] == 3
    assert r0["hashes"] == saved  # rank 0 gathers the full (unsharded) state
    assert "C121" in r0["codes"] and "C121" in r1["codes"]
    # Rank 1 had no saved state: its streams come from the documented derivation.
    seed_all(derived_seed(base_seed, 3, 1))
    assert r1["draw"] == [torch.rand(2).tolist(), random.random()]
    assert r0["draw"] != r1["draw"]


@pytest.mark.slow  # ~20 s; test_checkpointer_s3.py counts retries and the node cache by default
def test_sharded_s3_save_retries_and_one_reader_per_node(tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from s3_server import Traffic, make_bucket, s3_server

    traffic = Traffic(fail_every=4, fail_methods=("PUT",))  # every 4th upload: 503 SlowDown
    with s3_server(traffic) as endpoint:
        make_bucket(endpoint, "ckpt")
        traffic.reset()
        r0, r1 = (ok(r) for r in run_ranks("s3_sharded", 2, tmp_path, endpoint=endpoint))
        slowdowns, gets = traffic.slowdowns, dict(traffic.gets)
    assert r0["path"] == r1["path"] == "s3://ckpt/run/step-1"
    assert r0["step"] == r1["step"] == 1 and r0["same"] and r1["same"]
    # The client's own retries are off, so every 503 the server sent is one retry of ours,
    # reported per rank (rank 0 gathers them).
    retries = {f["rank"]: f["data"]["retries"] for f in r0["findings"] if f["code"] == "C203"}
    assert slowdowns > 0 and sum(retries.values()) == slowdowns
    # Both ranks loaded, but each object was downloaded once: by the node's first rank.
    payload = {k: n for k, n in gets.items() if not k.endswith("manifest.json")}
    assert {k.rsplit("/", 1)[-1] for k in payload} >= {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    assert set(payload.values()) == {1}
