"""The multi-process fire drills (`replica`, `straggler`, `hung_rank`): real `trainguard run
--nproc N` jobs on gloo, on the tiny corpus. The replica drill (deterministic, ~30 s) runs by
default; the straggler and hung-rank drills, through the CLI with the clean baseline, are slow.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runhelpers import run_cli
from trainguard.drills.matrix import DrillRow, verdict
from trainguard.drills.multiproc_scenarios import MULTIPROC_DRILLS, MultiProcRow
from trainguard.drills.runner import DrillContext, DrillPlan
from trainguard.drills.scenarios import DRILLS

# timing-based (stragglers, hangs, watchdogs, doctor): one after the other on one worker under xdist
pytestmark = pytest.mark.xdist_group("timing-serial")

STEPS = 36  # checkpoints every 6 steps; faults land at step 23 (F, 0-based) or 26 (F + I/2)
INTERVAL, FAULT = STEPS // 6, 4 * (STEPS // 6) - 1  # F: 0-based, checkpoint F+1 after it


def tiny_settings(corpus: Path, cache: Path) -> list[str]:
    return [
        f"data.source={corpus}",
        f"data.cache_dir={cache}",
        "tokenizer.vocab_size=512",
        "data.seq_len=32",
    ]


def ctx_rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_multiproc_drills_are_registered_and_run_by_default() -> None:
    assert set(MULTIPROC_DRILLS) <= set(DRILLS)
    # `trainguard drill` with no --only runs every registered drill.
    assert list(DRILLS)[-len(MULTIPROC_DRILLS) :] == list(MULTIPROC_DRILLS)


def test_incomparable_row_says_so_and_recovers_by_finishing() -> None:
    clean = DrillRow("clean", "none", [], finished=True, final_loss=2.0, loss_ratio=1.0)
    row = MultiProcRow("replica", "f", ["H201"], ["H201"], finished=True, final_loss=9.0)
    row.incomparable = "3 ranks need batch 6"
    row.compare_with(clean)
    assert row.loss_ratio is None and row.recovered and row.ok
    assert row.cells()[-1] == "n/a: 3 ranks need batch 6 (9.0000)"
    assert verdict([clean, row]) == []
    row.repaired = False  # e.g. the replicas diverged again after the rollback
    assert [f.code for f in verdict([row])] == ["R402"]
    comparable = MultiProcRow("straggler", "f", ["H202"], ["H202"], finished=True, final_loss=2.0)
    comparable.compare_with(clean)
    assert comparable.loss_ratio == 1.0 and comparable.cells()[-1] == "1.0000x (2.0000)"


@pytest.mark.slow  # ~25 s; test_distributed_gloo covers replica corruption (H201) by default
def test_replica_corruption_drill_names_rank_1_and_rolls_back(
    small_corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """bitflip@F+1/r1 on 3 ranks (after step F+1's update): the replica check of that very
    step (every 2 steps, from step 0) names rank 1 (H201), every rank rolls back to checkpoint
    F+1 (saved after step F), and the job finishes all its steps."""
    ctx = DrillContext(
        overrides=tiny_settings(small_corpus, cache_dir), plan=DrillPlan(STEPS), workdir=tmp_path
    )
    row = DRILLS["replica"].run(ctx)
    assert isinstance(row, MultiProcRow)
    assert row.detected == ["H201"], row.note
    assert row.inject == f"bitflip@{FAULT + 1}/r1"
    assert row.steps_to_detect == 0  # checked every 2 steps: F+1 is one of them
    assert row.action.startswith("rank 1 (")  # the rank and its host
    assert f"rolled back {FAULT + 1}->{FAULT + 1}" in row.action and row.steps_lost == 1
    assert row.finished and row.repaired and row.recovered and row.ok, row.note
    assert row.cells()[-1].startswith("n/a: 3 ranks need batch 6")
    events = [e for e in ctx_rows(tmp_path / "replica") if e.get("event") == "rollback"]
    assert [(e["from_step"], e["to_step"]) for e in events] == [(FAULT + 1, FAULT + 1)]


@pytest.fixture(scope="module")
def slow_drills(small_corpus: Path, cache_dir: Path, tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("mp-drills")
    sets = [a for s in tiny_settings(small_corpus, cache_dir) for a in ("--set", s)]
    res = run_cli(
        "drill",
        "--json",
        "--workdir",
        str(workdir),
        "--steps",
        str(STEPS),
        "--only",
        "straggler",
        "--only",
        "hung_rank",
        *sets,
        timeout=600,
    )
    payload = json.loads(res.stdout)
    payload["returncode"] = res.returncode
    payload["stderr"] = res.stderr
    payload["workdir"] = workdir
    return payload


def row(result: dict, name: str) -> dict:
    return next(r for r in result["rows"] if r["name"] == name)


@pytest.mark.slow
def test_slow_drills_pass(slow_drills: dict) -> None:
    assert [r["name"] for r in slow_drills["rows"]] == ["clean", "straggler", "hung_rank"]
    bad = [(r["name"], r["note"]) for r in slow_drills["rows"] if not r["ok"]]
    assert not bad and slow_drills["returncode"] == 0, (bad, slow_drills["stderr"][-2000:])


@pytest.mark.slow
def test_straggler_is_named_and_reported(slow_drills: dict) -> None:
    r = row(slow_drills, "straggler")
    # H202 after 5 steps behind; the job's throughput drop (R106) may come first.
    assert "H202" in r["detected"] and r["inject"] == f"slow@{FAULT}/r1"
    # Behind in `straggler_steps` (5) steps in a row from step F: named at F + 4 (or a little
    # later when a loaded machine lets it catch up for a step).
    assert 4 <= r["steps_to_detect"] <= 8
    assert r["action"].startswith("reported: rank 1 (") and "training went on" in r["action"]
    assert r["steps_lost"] == 0 and r["finished"] and r["recovered"]
    # 2 ranks at the clean run's batch size: the same batches, the same loss (to rounding).
    assert r["loss_ratio"] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.slow
def test_hung_rank_is_named_dumped_and_resumed(slow_drills: dict) -> None:
    r = row(slow_drills, "hung_rank")
    step = FAULT + INTERVAL // 2
    assert r["detected"][:2] == ["R301", "C150"] and r["inject"] == f"sleep@{step}/r1"
    assert r["steps_to_detect"] == 0
    assert r["action"].startswith("R301 rank 1 (")
    assert "stacks of rank 0, 1 dumped, exit 3" in r["action"]
    assert f"auto-resume from step {FAULT + 1}" in r["action"]
    assert r["steps_lost"] == step - 1 - FAULT and r["recovered"], r["note"]
    assert r["loss_ratio"] == pytest.approx(1.0, abs=1e-4)
    # Rank 0's report of the dead job (its metric log rewinds to checkpoint F+1 on resume).
    run_dir = slow_drills["workdir"] / "hung_rank"
    (report,) = run_dir.glob("hang-*-rank0.json")
    r301 = json.loads(report.read_text(encoding="utf-8"))
    assert r301["code"] == "R301" and r301["rank"] == 1 and r301["data"]["missing_ranks"] == [1]
    assert any(p.stat().st_size for p in run_dir.glob("stacks-rank1-*.txt"))
