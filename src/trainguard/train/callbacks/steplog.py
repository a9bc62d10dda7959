"""Each step's metrics row to the run's sinks (metrics.jsonl, TensorBoard, W&B: rank 0 only) and
to the progress display, which shows from the first step on and is closed when the run ends;
and a `checkpoint` event row for each committed checkpoint, the log's record that the run dir
has checkpoints to lose (`train/refusals.py` refuses to start over without them)."""

from __future__ import annotations

from typing import Any

from trainguard.train.callback import Callback, RunContext
from trainguard.train.refusals import CHECKPOINT_EVENT


class StepLogCallback(Callback):
    name = "steplog"
    priority = 90  # the row is in the log before anything the step's other callbacks find

    def pre_train(self, ctx: RunContext) -> None:
        ctx.display.start(ctx.step)

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        if ctx.is_main:
            ctx.metrics.write(row)
        ctx.display.update(step + 1, row["loss"], row["tokens_per_s"])  # steps done

    def post_checkpoint(self, ctx: RunContext, step: int, path: str) -> None:
        if ctx.is_main:  # at the checkpoint's step: a resume's cut keeps exactly those it kept
            row = {"kind": "event", "step": step, "event": CHECKPOINT_EVENT, "path": path}
            ctx.metrics.write(row)

    def close(self, ctx: RunContext) -> None:
        ctx.display.close()
