"""Real multi-process runs: `trainguard run --nproc N` through torch.distributed's elastic
launcher, gloo on 127.0.0.1, the tiny recipe.

- elastic resume 2 -> 1 -> 2 processes sees the batches of a 1-process run, losses within
  reduction-order error, and raises no replica, straggler or hang alarm;
- the drills on one 3-process run: a bit flipped in rank 1's weights (H201 names rank 1, the
  run rolls back), rank 2 slowed down (H202 names rank 2), rank 1 asleep in a step (R301 names
  rank 1, stacks dumped, exit status 3);
- checkpoints on a real S3 wire-protocol server (moto on 127.0.0.1), resumed with 2 processes
  under an external torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runhelpers import run_cli, tiny_recipe_dict

# timing-based (stragglers, hangs, watchdogs, doctor): one after the other on one worker under xdist
pytestmark = pytest.mark.xdist_group("timing-serial")

# Checks every 2 steps, so the clean runs below exercise them (and must stay quiet).
CHECKS = [
    "--set",
    "distributed.replica_check_interval=2",
    "--set",
    "distributed.straggler_interval=2",
]
RTOL = 1e-4  # a sum over 2 ranks' halves vs one sum: reduction order, nothing else


def why(res) -> str:
    """The workers' own error lines, then the launcher's summary."""
    lines = res.stderr.splitlines()
    return "\n".join(
        [line for line in lines if "error:" in line or "fix:" in line][:10] + lines[-15:]
    )


def torchrun(nproc: int, args: list[str], env: dict) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
    launcher += ["--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-id", "job1"]
    launcher += ["--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1"]
    full_env = {**os.environ, "CI": "1", **env}
    full_env.pop("TRAINGUARD_INJECT", None)
    return subprocess.run(
        [*launcher, "-m", "trainguard", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )


def rows(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def codes(run_dir: Path) -> list[str]:
    return [r["code"] for r in rows(run_dir, "finding")]


def assert_same_batches_and_losses(run: Path, reference: Path) -> None:
    got, want = rows(run, "step"), rows(reference, "step")
    assert [r["step"] for r in got] == list(range(12)), "steps replayed or missing"
    assert [r["batch_hash"] for r in got] == [r["batch_hash"] for r in want]
    for g, w in zip(got, want, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], rel=RTOL), g["step"]


def test_elastic_resume_2_then_1_then_2_processes(
    tiny_recipe: Path, finished_tiny_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "elastic"
    args = ["run", str(tiny_recipe), "--run-dir", str(run), "-q", *CHECKS]
    # 2 processes, killed at step 5 (0-based; checkpoint 4): the launcher reports the failure.
    res = run_cli(*args, "--nproc", "2", env={"TRAINGUARD_INJECT": "kill@5:data"})
    assert res.returncode != 0, why(res)
    assert [r["step"] for r in rows(run, "step")] == [0, 1, 2, 3, 4]
    # 1 process resumes from checkpoint 4, killed at step 9 (checkpoint 8).
    res = run_cli(*args, env={"TRAINGUARD_INJECT": "kill@9:data"})
    assert res.returncode == -signal.SIGKILL, why(res)
    # 2 processes again, to the end.
    res = run_cli(*args, "--nproc", "2", "--json")
    assert res.returncode == 0, why(res)
    summary = json.loads(res.stdout)  # rank 0 alone prints: one JSON document
    assert summary["final_step"] == 12 and summary["resumed_from"] == 8

    assert_same_batches_and_losses(run, finished_tiny_run)
    found = codes(run)
    assert found.count("C150") == 2  # resumed twice
    # Replayed steps 4 and 8 read the batches the other world size had logged (else D110);
    # the replica and straggler checks ran every 2 steps and found nothing.
    assert not {"D110", "H201", "H202", "R301"} & set(found), found
    assert len(rows(run, "event")) and any(
        r.get("event") == "rank_timings" for r in rows(run, "event")
    )
    # The straggler counts (steps behind, in step) are saved with the guard's state.
    state = json.loads((run / "checkpoints" / "step-12" / "state.json").read_text())
    assert state["values"]["guard"]["distributed"]["stragglers"]["in_step"]
    # No hang reports; the killed run's armed (empty) stack files were cleared on restart.
    assert not list(run.glob("hang-*.json"))
    assert [p.name for p in run.glob("stacks-rank*")] == []


# Slow (about 28 s, three ranks on two cores): the default suite keeps a rank named slow and
# then hung (test_guard_distributed), a corrupted replica rolled back across DDP ranks
# (test_guard_hf) and a killed rank named dead (test_dead_rank).
@pytest.mark.slow
def test_drills_bitflip_straggler_and_hung_rank(tiny_recipe: Path, tmp_path: Path) -> None:
    run = tmp_path / "drills"
    res = run_cli(
        "run",
        str(tiny_recipe),
        "--run-dir",
        str(run),
        "-q",
        "--nproc",
        "3",
        "--oversubscribe",  # 3 ranks on a 2-core machine: on purpose (a majority of replicas)
        *CHECKS,
        "--set",
        "train.batch_size=6",
        "--set",
        "train.max_steps=16",
        "--set",
        "distributed.collective_timeout_s=8",
        "--set",
        "distributed.hang_timeout_s=4",
        "--set",  # named after 2 steps behind: the slow rank has 4 steps before the hang
        "distributed.straggler_steps=2",
        env={"TRAINGUARD_INJECT": "bitflip@4/r1,slow@8/r2,sleep@12/r1"},  # steps from 0
    )
    assert res.returncode == 3, why(res)  # the hung-rank exit, for a restart
    findings = rows(run, "finding")
    by_code = {c: [f for f in findings if f["code"] == c] for c in ("H201", "H202", "R301")}
    assert sorted(f["code"] for f in findings) == ["H201", "H202", "R301"], findings

    # Found by the check of the flipped step itself (steps 0, 2, 4...), named by majority.
    (h201,) = by_code["H201"]
    assert h201["rank"] == 1 and h201["step"] == 4 and h201["data"]["suspect_ranks"] == [1]
    assert h201["where"]  # the host
    rollbacks = [r for r in rows(run, "event") if r.get("event") == "rollback"]
    assert [(r["from_step"], r["to_step"]) for r in rollbacks] == [(4, 4)]

    # Ranks compared at every step, scored when the timings are gathered: named once it was
    # behind in 2 steps in a row (from step 8: step 9), before the hang at step 12.
    (h202,) = by_code["H202"]
    assert h202["rank"] == 2 and 9 <= h202["step"] < 12

    (r301,) = by_code["R301"]  # rank 0 names the rank that never reached the barrier
    assert r301["rank"] == 1 and r301["step"] == 12 and r301["data"]["missing_ranks"] == [1]
    stack = run / r301["data"]["stack_file"]
    assert "Thread" in stack.read_text() or "thread" in stack.read_text()
    # The steps before the hang were all logged once (after the rollback's recomputation).
    assert sorted({r["step"] for r in rows(run, "step")}) == list(range(12))


@pytest.mark.slow  # the store faults run in CI through tests/test_distributed_store.py
def test_checkpoints_on_s3_resume_with_two_processes(
    small_corpus: Path, cache_dir: Path, finished_tiny_run: Path, tmp_path: Path
) -> None:
    from s3_server import make_bucket, s3_server, storage_options

    with s3_server() as endpoint:
        fs = make_bucket(endpoint, "ckpts")
        recipe = tiny_recipe_dict(small_corpus, cache_dir)
        recipe["checkpoint"] |= {
            "dir": "s3://ckpts/tiny",
            "storage_options": storage_options(endpoint),
        }
        path = tmp_path / "s3.yaml"
        path.write_text(yaml.safe_dump(recipe))
        run = tmp_path / "s3run"
        env = {"TRAINGUARD_CACHE": str(tmp_path / "tgcache")}  # the download caches
        args = ["run", str(path), "--run-dir", str(run), "-q"]
        res = run_cli(*args, env={**env, "TRAINGUARD_INJECT": "kill@5:data"})
        assert res.returncode == -signal.SIGKILL, why(res)
        assert not (run / "checkpoints").exists()  # nothing written locally
        assert fs.exists("ckpts/tiny/step-4/manifest.json")

        # Resumed under an external torchrun, with the rendezvous flags a multi-node job uses.
        res = torchrun(2, args, env)
        assert res.returncode == 0, why(res)
        resumed = [f for f in rows(run, "finding") if f["code"] == "C150"]
        assert [f["step"] for f in resumed] == [4]
        assert_same_batches_and_losses(run, finished_tiny_run)
        fs.invalidate_cache()
        steps = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("ckpts/tiny"))
        assert steps == ["step-12", "step-4", "step-8"]  # keep=3
        for s in steps:
            assert fs.exists(f"ckpts/tiny/{s}/manifest.json")
        # The machine fetched step 4 once into its node cache; both ranks read that copy.
        from test_distributed_store import cached_steps

        assert cached_steps(tmp_path / "tgcache").count("step-4") == 1
