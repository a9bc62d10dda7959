"""The validation loss of `trainguard run`: every `train.eval_interval` steps, at the last step,
and once at the end if this process evaluated nothing (a run resumed at its last step still
reports where the model stands). With a prediction band (`prediction.band`), each evaluation
feeds the off-track alarm (E151, E152): the loss must stay where the scaling-law fit put it.
"""

from __future__ import annotations

from typing import Any

from trainguard.train.callback import Callback, RunContext
from trainguard.train.compute import StepMath


class ValidationCallback(Callback):
    name = "validation"
    priority = 50

    def __init__(self, math: StepMath, offtrack: Any = None) -> None:
        self.math = math
        self.offtrack = offtrack  # scaling.offtrack.OffTrackMonitor, or None
        self.last: dict[str, float] = {}
        """The latest evaluation of this process: the run's final val_loss and val_bpb."""

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        t, done = ctx.recipe.train, step + 1  # the eval row says how many steps are done
        if done % t.eval_interval == 0 or done == t.max_steps:
            self.evaluate(ctx)

    def post_train(self, ctx: RunContext) -> None:
        if not self.last:
            self.evaluate(ctx)

    def evaluate(self, ctx: RunContext) -> None:
        ctx.set_phase("eval")
        result = self.math.evaluate()
        self.last = result
        if ctx.is_main:
            ctx.metrics.write(
                {"kind": "eval", "step": ctx.step, "tokens": ctx.tokens_seen, **result}
            )
        if self.offtrack is not None:
            ctx.record(self.offtrack.update(ctx.step, {**result, "tokens": ctx.tokens_seen}))
        ctx.display.message(
            f"eval @ step {ctx.step}: val_loss {result['val_loss']:.4f}  "
            f"val_bpb {result['val_bpb']:.4f}"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"offtrack": self.offtrack.state_dict()} if self.offtrack is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.offtrack is not None and "offtrack" in state:
            self.offtrack.load_state_dict(state["offtrack"])
