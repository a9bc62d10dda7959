"""Issue 24, item 1 for a user's loop: the record the public `Guard(run_dir=...)` writes is
accounted like `trainguard run`'s (goodput/loop_timing.py). A loop made of the public parts
crashes after its second checkpoint, its newest checkpoint is damaged, and it is started again:
the record holds each step once, the steps the resume redid, the restart, the checkpoint
stalls, the end, and the finding of the checkpoint the resume passed over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import trainguard
from publicloop import Crash, public_loop
from trainguard.drills.chaos import corrupt_newest
from trainguard.goodput.accounting import account_run
from trainguard.metrics.jsonl import read_metrics

STEPS, EVERY, CRASH = 12, 3, 8


@pytest.fixture(scope="module")
def crashed_and_resumed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("own-loop")
    with pytest.raises(Crash):
        public_loop(out, crash_at=CRASH)
    flipped = corrupt_newest(out / "checkpoints")
    assert flipped == "a byte of step-6/state.safetensors flipped"  # the resume falls back to 3
    public_loop(out)
    return out


def test_the_record_holds_each_step_once_after_a_crash(crashed_and_resumed: Path) -> None:
    steps = [r["step"] for r in read_metrics(crashed_and_resumed) if r.get("kind") == "step"]
    assert steps == list(range(STEPS))  # 3..7 ran twice; the first attempt's rows are cut


def test_the_restart_and_the_steps_it_redid_are_accounted(crashed_and_resumed: Path) -> None:
    g = account_run(crashed_and_resumed)
    assert g.attempts == 2 and g.recorded
    (restart,) = g.restarts
    assert restart.resumed_from == 3 and restart.lost_steps == CRASH - 3
    assert g.redone_steps == CRASH - 3 and g.steps == STEPS
    # Saves 3 and 6 before the crash, 6, 9 and 12 after; the first 6 is in the redone time.
    assert len(g.checkpoint_stalls) == 1 + 3
    assert g.seconds["startup"] > 0 and g.seconds["checkpoint"] > 0
    assert sum(g.seconds.values()) == pytest.approx(g.wall_s)


def test_the_resume_finding_is_kept_after_the_cut(crashed_and_resumed: Path) -> None:
    rows = read_metrics(crashed_and_resumed)
    attempts = [i for i, r in enumerate(rows) if r.get("what") == "attempt"]
    c101 = [i for i, r in enumerate(rows) if r.get("code") in ("C101", "C102")]
    assert len(attempts) == 2 and c101, [r.get("code") for r in rows if r.get("code")]
    assert rows[c101[0]]["step"] == 6 and attempts[1] < c101[0]  # the second process's start
    assert rows[-1]["what"] == "end" and rows[-1]["step"] == STEPS  # completed steps
    run = json.loads((crashed_and_resumed / "run.json").read_text())
    assert run["schema_version"] == 2


def test_a_fresh_start_in_a_used_folder_keeps_the_earlier_record(tmp_path: Path) -> None:
    """A loop that starts at step 0 where a record already is (a reused output folder) is a
    new run: the earlier log is kept aside, never cut, and no restart is invented."""
    public_loop(tmp_path, steps=6, every=3, checkpoints="first")
    earlier = (tmp_path / "metrics.jsonl").read_text()
    public_loop(tmp_path, steps=6, every=3, checkpoints="second")  # no checkpoint: step 0
    assert (tmp_path / "metrics.earlier.jsonl").read_text() == earlier
    g = account_run(tmp_path)
    assert g.attempts == 1 and g.restarts == [] and g.steps == 6


def test_only_global_rank_0_writes_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank may build `Guard(run_dir=D)` with the same D: rank 1 writes no record (its
    first step would otherwise cut rank 0's log), and closing twice ends the record once."""
    monkeypatch.setenv("RANK", "1")
    public_loop(tmp_path / "rank1", steps=6, every=3)
    assert not (tmp_path / "rank1" / "metrics.jsonl").exists()
    assert not (tmp_path / "rank1" / "run.json").exists()
    monkeypatch.setenv("RANK", "0")
    guard = trainguard.Guard(run_dir=tmp_path / "rank0")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    guard.judge(0, loss=torch.tensor(1.0), model=model, optimizer=optimizer).optimizer_step(
        optimizer
    )
    guard.close()
    guard.close()
    ends = [r for r in read_metrics(tmp_path / "rank0") if r.get("what") == "end"]
    assert [r["step"] for r in ends] == [1]
