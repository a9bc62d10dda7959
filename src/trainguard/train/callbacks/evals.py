"""Use-case evals inside `trainguard run`: before the first step (the baseline), every K steps
and at the end (`evals/schedule.py`); their rows go to the metric log, their findings (a drop
against the best so far, leaked canaries) are recorded. Off with `trainguard run --no-evals`.
"""

from __future__ import annotations

from typing import Any

from trainguard.evals.schedule import EvalSchedule
from trainguard.train.callback import Callback, RunContext


class EvalsCallback(Callback):
    name = "evals"
    priority = 40  # after the validation loss, as the step's other evaluations

    def __init__(self, schedule: EvalSchedule) -> None:
        self.schedule = schedule

    def pre_train(self, ctx: RunContext) -> None:
        self._maybe_run(ctx, ctx.step)  # the baseline (or nothing, if this step had its evals)

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        done = step + 1  # the schedule counts completed steps (0: the baseline)
        self._maybe_run(ctx, done, final=done == ctx.recipe.train.max_steps)

    def _maybe_run(self, ctx: RunContext, step: int, final: bool = False) -> None:
        if not self.schedule.due(step, final=final):
            return
        ctx.set_phase("eval")
        row, findings = self.schedule.run(ctx.model, step)
        if ctx.is_main:
            ctx.metrics.write(row)
        ctx.record(findings)

    def state_dict(self) -> dict[str, Any]:
        return {"schedule": self.schedule.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "schedule" in state:
            self.schedule.load_state_dict(state["schedule"])
