"""Goodput accounting (goodput/accounting.py, docs/goodput.md): the wall time of a run across its
restarts, split into categories that sum to it; a run killed twice reports what it lost."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from runhelpers import run_cli
from trainguard.goodput.accounting import CATEGORIES, account, account_run
from trainguard.metrics.jsonl import read_metrics


def _step(step: int, end: float, dur: float = 1.0, data: float = 0.0, action=None) -> dict:
    return {
        "kind": "step",
        "step": step,
        "time": end,
        "step_time_s": dur,
        "data_time_s": data,
        "action": action,
    }


def _attempt(start: float, resumed=None, lost=None) -> dict:
    return {
        "kind": "timing",
        "what": "attempt",
        "time": start + 0.5,
        "process_start": start,
        "resumed_from": resumed,
        "lost": lost,
    }


def _assert_sums(g) -> None:
    total = sum(g.seconds.values())
    assert total == pytest.approx(g.wall_s, abs=1e-9)
    assert all(v >= 0 for v in g.seconds.values())
    assert set(g.seconds) == set(CATEGORIES)


def test_categories_of_a_synthetic_record_with_a_kill_a_rollback_and_a_skip() -> None:
    t = 1000.0
    rows = [
        _attempt(t),
        # start-up 2 s, then steps of 1 s (0.25 s of data wait each)
        _step(1, t + 3, data=0.25),
        _step(2, t + 4, data=0.25),
        {"kind": "timing", "what": "checkpoint", "step": 2, "seconds": 0.5, "time": t + 4.5},
        _step(3, t + 5.5, action="skip"),
        {"kind": "timing", "what": "copy_wait", "step": 3, "seconds": 0.2},
        {"kind": "timing", "what": "eval", "step": 3, "seconds": 1.0, "time": t + 6.5},
        # steps 4 and 5 were cut by the resume below (killed at t + 9, last record t + 8)
        _attempt(t + 12, resumed=3, lost={"steps": 2, "until": t + 8}),
        _step(4, t + 15),  # restart: 8 -> 15 minus the step = 6 s
        _step(5, t + 16),
        {"kind": "event", "event": "rollback", "step": 4},
        _step(5, t + 18),  # 1 s of rollback (step 5's first pass redone, and the gap)
        {"kind": "timing", "what": "end", "step": 5, "time": t + 18.5},
    ]
    g = account(rows)
    _assert_sums(g)
    assert g.wall_s == pytest.approx(18.5)
    s = g.seconds
    assert s["startup"] == pytest.approx(2.0)
    assert s["checkpoint"] == pytest.approx(0.5 + 0.2)
    assert s["skipped"] == pytest.approx(1.0 - 0.2)
    assert s["eval"] == pytest.approx(1.0)
    assert s["redone"] == pytest.approx((8 - 6.5) + 1.0 + 1.0)  # the cut tail, step 5, the gap
    assert s["restart"] == pytest.approx(15 - 1 - 8)
    assert s["data_wait"] == pytest.approx(0.5)
    assert s["productive"] == pytest.approx(0.75 * 2 + 1 + 1)
    assert s["other"] == pytest.approx(0.5)  # the end of the last step to the end row
    assert g.redone_steps == 3 and g.rollback_steps == 1 and g.skipped_steps == 1
    assert g.steps == 4 and g.attempts == 2
    (r,) = g.restarts
    assert r.lost_steps == 2 and r.downtime_s == pytest.approx(4.0)
    assert r.startup_s == pytest.approx(2.0)


def test_a_restart_whose_steps_a_later_resume_dropped_keeps_its_start_up() -> None:
    """The second process resumed, ran two steps and hung; the third resumed from the same
    checkpoint and dropped them. Its restart still ends at its first step (the first_step
    row), and only what came after is redone."""
    t = 0.0
    rows = [
        _attempt(t),
        _step(1, t + 2),
        _step(2, t + 3),
        _attempt(t + 6, resumed=2, lost={"steps": 1, "until": t + 4}),
        {"kind": "timing", "what": "first_step", "time": t + 8},
        _attempt(t + 13, resumed=2, lost={"steps": 2, "until": t + 10}),
        _step(3, t + 16),
        {"kind": "timing", "what": "first_step", "time": t + 15},
        _step(4, t + 17),
        {"kind": "timing", "what": "end", "step": 4, "time": t + 17},
    ]
    g = account(rows)
    _assert_sums(g)
    assert g.wall_s == pytest.approx(17)
    assert [(r.downtime_s, r.startup_s) for r in g.restarts] == [(2, 2), (3, 2)]
    assert g.seconds["restart"] == pytest.approx(9) and g.seconds["redone"] == pytest.approx(3)
    assert g.seconds["productive"] == pytest.approx(4) and g.redone_steps == 3


def test_a_log_without_timing_rows_is_counted_from_its_first_step() -> None:
    g = account([_step(1, 10.0), _step(2, 11.5), _step(3, 12.5)])
    _assert_sums(g)
    assert g.wall_s == pytest.approx(3.5) and not g.recorded
    assert g.seconds["other"] == pytest.approx(0.5)


def _lost_at_kill(run_dir: Path) -> int:
    """Seen from outside after a kill: the step rows logged from the newest committed
    checkpoint on disk on (its manifest written; checkpoint c holds steps 0..c-1, the rows
    count steps from 0), which a resume recomputes."""
    done = [
        int(d.name.removeprefix("step-"))
        for d in (run_dir / "checkpoints").glob("step-*")
        if (d / "manifest.json").is_file()
    ]
    steps = [r["step"] for r in read_metrics(run_dir) if r.get("kind") == "step"]
    return sum(1 for s in steps if s >= max(done, default=0))


def test_a_finished_run_records_its_start_its_saves_and_its_end(finished_tiny_run: Path) -> None:
    rows = read_metrics(finished_tiny_run)
    g = account(rows)
    _assert_sums(g)
    assert g.recorded and g.attempts == 1 and not g.restarts
    assert g.steps == 12 and g.redone_steps == 0
    assert g.seconds["startup"] > 0 and g.seconds["checkpoint"] > 0 and g.seconds["eval"] > 0
    assert len(g.checkpoint_stalls) == 3  # steps 4, 8, 12
    whats = [r["what"] for r in rows if r.get("kind") == "timing"]
    assert whats[0] == "attempt" and whats[-1] == "end"


@pytest.mark.slow  # three processes one after the other: 10-25 s on 2 busy cores
def test_a_run_killed_twice_reports_the_steps_it_redid_and_its_restarts(
    tiny_recipe: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = ["run", str(tiny_recipe), "--run-dir", str(run_dir), "--json", "-q", "--no-evals"]
    lost: list[int] = []
    before: list[float] = []
    # Killed in step 7 (steps count from 0; after checkpoint 4: steps 4, 5 and 6 are lost), then
    # in step 11 (after checkpoint 8: steps 8, 9 and 10), then run to the end, as a scheduler
    # relaunches a job.
    for fault in ("kill@7:backward", "kill@11:backward"):
        before.append(time.time())
        p = run_cli(*args, env={"TRAINGUARD_INJECT": fault})
        assert p.returncode == -9, p.stderr[-2000:]
        lost.append(_lost_at_kill(run_dir))
    before.append(time.time())
    p = run_cli(*args)
    after = time.time()
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    g = out["goodput"]
    assert g == account_run(run_dir).to_dict()
    assert sum(g["seconds"].values()) == pytest.approx(g["wall_s"], rel=1e-9)
    assert g["attempts"] == 3
    assert lost == [3, 3]  # what the faults planned, measured from outside
    assert [r["lost_steps"] for r in g["restarts"]] == lost
    assert g["redone_steps"] == sum(lost)
    assert g["steps"] == 12  # every step kept once
    # What the test saw from outside bounds what the record says: the run's wall time lies
    # inside the time the three processes ran, each restart after the kill that caused it.
    assert 0 < g["wall_s"] <= after - before[0]
    # Each restart spans the moment the test relaunched the job: from the dead process's last
    # record (before the relaunch) to the first resumed step (after it).
    for r, relaunched in zip(g["restarts"], before[1:], strict=True):
        assert r["began"] <= relaunched <= r["resumed_at"]
        assert r["restart_s"] == pytest.approx(r["resumed_at"] - r["began"])
    assert g["seconds"]["restart"] == pytest.approx(sum(r["restart_s"] for r in g["restarts"]))
    assert g["seconds"]["redone"] > 0 and g["seconds"]["checkpoint"] > 0
    assert 0 < g["goodput"] < 1


def test_plan_reads_the_restart_and_write_times_of_a_run_record(tmp_path: Path) -> None:
    """`trainguard plan --run` took the restart and the write time from flags only; a record
    with timing rows holds both (medians of the restarts and of the saves)."""
    from typer.testing import CliRunner

    from trainguard.cli import app

    t = 1000.0
    rows = [
        {"kind": "event", "step": 0, "event": "start", "env": {"world_size": 1}},
        _attempt(t),
        _step(1, t + 3),
        _step(2, t + 4),
        {"kind": "timing", "what": "checkpoint", "step": 2, "seconds": 0.5, "time": t + 4.5},
        {"kind": "timing", "what": "write", "step": 2, "seconds": 2.0},
        _step(3, t + 5.5),
        # killed after step 3 (last record t + 5.5), relaunched at t + 8, first step at t + 10
        _attempt(t + 8, resumed=2, lost={"steps": 1, "until": t + 5.5}),
        _step(3, t + 11),
        _step(4, t + 12),
        {"kind": "timing", "what": "checkpoint", "step": 4, "seconds": 0.25, "time": t + 12.25},
        {"kind": "timing", "what": "write", "step": 4, "seconds": 3.0},
    ]
    (tmp_path / "recipe.yaml").write_text("checkpoint:\n  interval: 2\n")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = CliRunner().invoke(app, ["plan", "--run", str(tmp_path), "--gpus", "64", "--json"])
    assert res.exit_code == 0, res.output
    inputs = json.loads(res.output)["inputs"]
    assert inputs["restart_s"]["source"] == "run"
    assert inputs["restart_s"]["value"] == pytest.approx(10 - 5.5)
    assert inputs["checkpoint_write_s"]["source"] == "run"
    assert inputs["checkpoint_write_s"]["value"] == pytest.approx(2.5)
    assert inputs["checkpoint_stall_s"]["value"] == pytest.approx(0.375)


def test_the_report_shows_the_goodput_bar_and_its_shares(tiny_run_copy: Path) -> None:
    from trainguard.report.build import write_report

    html, md = write_report(tiny_run_copy)
    page = html.read_text()
    assert '<img alt="goodput" src="data:image/png;base64,' in page
    assert "## Goodput" in md.read_text()
    shares = account_run(tiny_run_copy).to_dict()["shares"]
    assert f"{shares['productive']:.1%}" in page
