"""Checkpoints of `trainguard run` as a callback: after every `checkpoint.interval` steps and at
the end (`saving.checkpoint_due`), once the step is settled and every other callback has seen
its row (the validation loss, the evals, the reference comparison are then in the state it
saves). The writing itself (in the background, a queue of snapshots, the commit recorded in
the order of the saves) is `train/saving.py`'s, which the loop also calls where it must wait
for the writes: before a rollback and at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainguard.train import saving
from trainguard.train.callback import Callback, RunContext


class CheckpointCallback(Callback):
    name = "checkpoint"
    priority = -50  # after the step's other callbacks: their state is in the checkpoint

    def __init__(self) -> None:
        self.save: Callable[[int], None] | None = None
        """`save(step)`: the checkpoint after step `step` (bound by `compose` to the loop)."""

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        if saving.checkpoint_due(ctx.recipe, step + 1):  # step + 1 completed steps
            assert self.save is not None, "compose binds the save to the loop"
            self.save(step)
