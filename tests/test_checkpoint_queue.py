"""Frequent asynchronous saves (checkpoint/save_queue.py): with a queue of N a save waits for
the writer only when N snapshots are held; the files are still byte for byte a save in the
loop's; the number of copies held never exceeds N; with `when_full="skip"` a save that would
wait is skipped and reported (C124); what was queued, waited and skipped is counted. In
`trainguard run` a save every step with a held writer lets the loop go on until the queue is
full. Every held writer here is released by an event the test's own loop reaches; the
timeouts only keep a broken build from hanging."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loophelpers import run_state
from test_checkpoint_staging import FILES, GatedLayout, train_step, training
from test_run_loop import recipe_for, run_in_process  # noqa: F401 (a fixture)
from trainguard import ElasticSampler
from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.checkpoint.layout import FlatLayout
from trainguard.errors import BadInputError
from trainguard.train.callback import Callback, RunContext
from trainguard.train.run_state import RunState


def until(condition: Callable[[], bool]) -> bool:
    """Poll `condition` until it holds (False after two minutes: a broken build)."""
    for _ in range(12_000):
        if condition():
            return True
        time.sleep(0.01)
    return False


def saving(background_copy: bool, tmp_path: Path, **queue: Any):
    model, opt = training("adamw")
    progress = RunState()
    state = run_state(
        model, opt, ElasticSampler(100, global_batch_size=2, seed=0), progress=progress
    )
    layout = GatedLayout()
    checkpointer = Checkpointer(
        tmp_path / "async",
        keep=10,
        async_save=True,
        layout=layout,
        background_copy=background_copy,
        **queue,
    )
    return model, opt, progress, state, layout, checkpointer


@pytest.mark.parametrize("background_copy", [False, True])
def test_saves_every_step_queue_while_the_writer_is_held_and_stay_bitwise(
    tmp_path: Path, torch_globals: None, background_copy: bool
) -> None:
    """Queue of 3, writer held: saves 1-3 return (and their copies are made) while save 1's
    write has not started to write; save 4 finds 3 held and waits for the oldest. Every
    file equals a save in the loop's, so no queued snapshot's copy was overwritten by a later
    one; the copies held are 3 sets, never more. The test waits for events only (the count
    of saves that waited for room), never for a time."""
    model, opt, progress, state, layout, checkpointer = saving(background_copy, tmp_path, queue=3)
    in_loop = Checkpointer(tmp_path / "sync", keep=10)
    handles, held, returned = [], [], threading.Event()

    def loop() -> None:
        for step in (1, 2, 3):
            train_step(model, opt)
            progress.step = step
            in_loop.save(step, state)
            handles.append(checkpointer.save(step, state))
            checkpointer.wait_copied()
            held.append(checkpointer.pending_saves())
        returned.set()

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        assert returned.wait(timeout=120), "a save waited for the held writer"
        assert not layout.gate.is_set() and held == [1, 2, 3]
        assert [h.queued for h in handles] == [0, 1, 2]
        train_step(model, opt)
        progress.step = 4
        in_loop.save(4, state)
        fourth = threading.Thread(target=lambda: handles.append(checkpointer.save(4, state)))
        fourth.start()  # 3 are held: it must wait for the oldest write, which is held
        assert until(lambda: checkpointer.queue_counts["waited"] == 1)
        assert len(handles) == 3  # still waiting
        layout.gate.set()
        fourth.join()
        checkpointer.wait_copied()
        for step in (5, 6):
            train_step(model, opt)
            progress.step = step
            in_loop.save(step, state)
            handles.append(checkpointer.save(step, state))
            checkpointer.wait_copied()
            assert checkpointer.pending_saves() <= 3
    finally:
        layout.gate.set()
        worker.join()
        checkpointer.close()
    assert handles[3].queued == 2 and handles[3].waited_s > 0
    counts = checkpointer.queue_counts
    assert counts["saved"] == 6 and counts["skipped"] == 0
    assert counts["queued"] >= 3 and counts["waited"] >= 1
    assert len(layout.stagings) == 3  # the memory bound: one set of copies per slot
    assert checkpointer.steps() == [1, 2, 3, 4, 5, 6]
    for step in range(1, 7):
        for name in FILES:
            a = (tmp_path / "async" / f"step-{step}" / name).read_bytes()
            b = (tmp_path / "sync" / f"step-{step}" / name).read_bytes()
            assert a == b, f"step {step}: {name} differs"


def test_a_save_that_would_wait_is_skipped_and_reported(
    tmp_path: Path, torch_globals: None
) -> None:
    model, opt, progress, state, layout, checkpointer = saving(
        True, tmp_path, queue=1, when_full="skip"
    )
    try:
        train_step(model, opt)
        progress.step = 1
        first = checkpointer.save(1, state)  # held: the gate is closed
        checkpointer.wait_copied()
        train_step(model, opt)
        progress.step = 2
        second = checkpointer.save(2, state)
        assert second.skipped and second.wait() is None
        assert [(f.code, f.step, f.severity) for f in second.findings] == [("C124", 2, "info")]
        layout.gate.set()
        third = checkpointer.save(3, state, may_skip=False)  # waits for room instead
        assert not third.skipped
        assert first.wait().endswith("step-1") and third.wait().endswith("step-3")
    finally:
        layout.gate.set()
        checkpointer.close()
    assert checkpointer.steps() == [1, 3]
    counts = checkpointer.queue_counts
    assert counts["skipped"] == 1 and counts["saved"] == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"queue": 0},
        {"queue": True},
        {"queue": "2"},
        {"when_full": "drop"},
        {"queue": 2, "async_save": False},
        {"when_full": "skip", "async_save": False},
    ],
)
def test_a_queue_setting_that_cannot_work_is_refused(tmp_path: Path, kwargs: dict) -> None:
    kwargs = {"async_save": True, **kwargs}
    with pytest.raises(BadInputError) as e:
        Checkpointer(tmp_path, **kwargs)
    assert e.value.fix  # names the fix


def gated_writes(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[int]]:
    """Every checkpoint write of `trainguard run` waits for the returned event; the steps whose
    write went on because the wait timed out (the loop never opened it) are listed."""
    gate, real_write, timed_out = threading.Event(), FlatLayout.write, []

    def gated_write(self: FlatLayout, folder: Path, snapshot: Any) -> None:
        if not gate.wait(timeout=120):
            timed_out.append(snapshot[0]["values"]["run"]["step"])
        real_write(self, folder, snapshot)

    monkeypatch.setattr(FlatLayout, "write", gated_write)
    return gate, timed_out


class OpenAt(Callback):
    """Opens `gate` at the start of step `step`, noting what the loop had done by then."""

    name = "open-at"

    def __init__(self, gate: threading.Event, step: int) -> None:
        self.gate, self.step, self.seen = gate, step, {}

    def pre_step(self, ctx: RunContext, step: int) -> None:
        if step == self.step:
            root = ctx.run_dir / "checkpoints"
            self.seen = {
                "committed": sorted(p.parent.name for p in root.glob("step-*/manifest.json"))
            }
            self.gate.set()


def test_the_run_trains_on_with_a_save_every_step_until_the_queue_is_full(
    recipe_for,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """checkpoint.interval 1, queue 3, every write held until step 3 (0-based: the fourth)
    begins: checkpoints 1-3 are saved and the loop trains on with nothing committed (a loop
    waiting for a write would never reach step 3, and the gate's timeout would let the write go
    on); the end waits for every write."""
    gate, timed_out = gated_writes(monkeypatch)
    opener = OpenAt(gate, 3)
    recipe = recipe_for(max_steps=6, eval_interval=6)
    recipe.checkpoint.interval, recipe.checkpoint.queue, recipe.checkpoint.keep = 1, 3, 10
    run = run_in_process(recipe, tmp_path / "run", [opener])
    assert opener.seen == {"committed": []} and timed_out == []
    assert run.loop is not None
    checkpointer = run.loop.checkpointer
    assert checkpointer.steps() == [1, 2, 3, 4, 5, 6]  # nothing skipped, the end waited
    counts = checkpointer.queue_counts
    assert counts["saved"] == 6 and counts["queued"] >= 2  # 2 and 3 behind the held write
    assert len(checkpointer.layout.stagings) <= 3


def test_the_run_skips_saves_that_would_wait_and_reports_them(
    recipe_for,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """when_full: skip with a queue of 1 and the first write held until step 3 (0-based: the
    fourth) begins: checkpoints 2 and 3 are skipped (C124 in the run's findings), checkpoint
    4, the last, waits and is saved."""
    gate, timed_out = gated_writes(monkeypatch)
    opener = OpenAt(gate, 3)
    recipe = recipe_for(max_steps=4, eval_interval=4)
    recipe.checkpoint.interval, recipe.checkpoint.keep = 1, 10
    recipe.checkpoint.queue, recipe.checkpoint.when_full = 1, "skip"
    run = run_in_process(recipe, tmp_path / "run", [opener])
    assert opener.seen == {"committed": []} and timed_out == []
    assert run.loop is not None
    assert run.loop.checkpointer.steps() == [1, 4]
    assert [f.step for f in run.ctx.findings if f.code == "C124"] == [2, 3]
