"""Each step's metrics row to the run's sinks (metrics.jsonl, TensorBoard, W&B: rank 0 only) and
to the progress display, which shows from the first step on and is closed when the run ends."""

from __future__ import annotations

from typing import Any

from trainguard.train.callback import Callback, RunContext


class StepLogCallback(Callback):
    name = "steplog"
    priority = 90  # the row is in the log before anything the step's other callbacks find

    def pre_train(self, ctx: RunContext) -> None:
        ctx.display.start(ctx.step)

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        if ctx.is_main:
            ctx.metrics.write(row)
        ctx.display.update(step, row["loss"], row["tokens_per_s"])

    def close(self, ctx: RunContext) -> None:
        ctx.display.close()
