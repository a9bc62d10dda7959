"""`trainguard run` with the guard deciding on the device (`guards.decide_on`; on CUDA by
default): the loop never waits for the device inside a step.

The protocol is the host path's (`Guard.judge`, `Guard.settle`, `Guard.after_update`); what
differs is when a decision is known: `judge` masks this step's update on the device and reads
back the previous step's decision, and `after_update` reads back this step's before what must
see a settled run (a checkpoint, a validation loss). This module holds what waits meanwhile:
each step's row, handed to the callbacks (`post_step`) once its decision is settled, as the
host path does at once; and the time between step starts, the step's time on this path.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainguard.guard.decision import Decision
from trainguard.train.compute import StepResult

# The columns of guard.detectors.moe.router_summary.
MOE_COLUMNS = ("moe_drop_frac", "moe_load_max", "moe_load_min")

if TYPE_CHECKING:
    from trainguard.train.loop import Loop


class DeviceSteps:
    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.held: dict[int, dict[str, Any]] = {}  # step -> its row, loss and action to come
        self.known: dict[int, Decision] = {}  # step -> its decision, settled before its row
        self._last_start: float | None = None
        self.interval = 0.0  # seconds between the last two step starts: the step's time

    def tokens_per_s(self, tokens: int, t0: float) -> float:
        """Tokens over the time between consecutive step starts. The host waits for the device
        a step late, so in steady state this is the device's pace; the time to queue one step's
        kernels (what `t0` to now measures here) is not."""
        last, self._last_start = self._last_start, t0
        self.interval = max((t0 - last) if last is not None else time.perf_counter() - t0, 1e-9)
        return tokens / self.interval

    def router_reader(self, out: StepResult) -> Callable[[], dict[str, dict]] | None:
        """R601-R604's counts, read with the step's values (`Guard.step_async` calls it)."""
        counts, math = out.router_counts, self.loop.math
        if counts is None:
            return None
        return lambda: math.router_stats_from(counts.tolist())

    def hold(self, step: int, row: dict[str, Any]) -> None:
        """Step `step`'s row, handed to the callbacks when its decision is settled (at once if
        it already is)."""
        self.held[step] = row
        if step in self.known:
            self.settled(self.known.pop(step))

    def reset(self) -> None:
        """A rollback: the rows waiting are of steps that will be computed again."""
        self.held.clear()
        self.known.clear()
        self._last_start = None

    def settled(self, decision: Decision) -> None:
        """The decision of a step is settled: its row gets the values read back and goes to
        the callbacks."""
        row = self.held.pop(decision.step, None)
        if row is None:  # read back before its row was written (`after_update`)
            self.known[decision.step] = decision
            return
        values = decision.values
        row |= {"loss": values.get("loss"), "grad_norm": values.get("grad_norm")}
        if "vetoed_by" not in row:  # a callback's veto stands whatever the guard said
            row |= {"action": decision.action}
        row |= {k: values[k] for k in MOE_COLUMNS if k in values}
        if row["action"] != "apply":
            row["lr"] = 0.0
        loop = self.loop
        loop.callbacks.post_step(loop.ctx, decision.step, row)
