"""`trainguard run` with the guard deciding on the device (`guards.decide_on`; on CUDA by
default): the loop never waits for the device inside a step.

Per step, `judge` gives the step's loss and gradient norm (device tensors) to
`Guard.step_async`, which masks the update on the device (guard/device.py), and settles the
previous step: its findings, its rerun, its rollback or halt, and its step row, held until its
values are read back and then handed to the callbacks (`post_step`) as the host path does at
once. `flush` settles the current step now: the loop calls it before what must see a settled
run (a checkpoint, a validation loss, a replica rollback, the end). What is settled, and how,
is what the host path does with its own decision; only when changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from trainguard.guard.decision import Decision
from trainguard.guard.device import PendingStep
from trainguard.train.actions import rerun, roll_back
from trainguard.train.compute import StepResult

# The columns of guard.detectors.moe.router_summary.
MOE_COLUMNS = ("moe_drop_frac", "moe_load_max", "moe_load_min")

if TYPE_CHECKING:
    from trainguard.train.loop import Loop


class DeviceSteps:
    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.held: dict[int, dict[str, Any]] = {}  # step -> its row, loss and action to come
        self._last_start: float | None = None
        self.interval = 0.0  # seconds between the last two step starts: the step's time

    def tokens_per_s(self, tokens: int, t0: float) -> float:
        """Tokens over the time between consecutive step starts. The host waits for the device
        a step late, so in steady state this is the device's pace; the time to queue one step's
        kernels (what `t0` to now measures here) is not."""
        last, self._last_start = self._last_start, t0
        self.interval = max((t0 - last) if last is not None else time.perf_counter() - t0, 1e-9)
        return tokens / self.interval

    def judge(self, step: int, out: StepResult, tokens_per_s: float) -> PendingStep | None:
        """This step judged on the device, the previous one settled; None after a rollback."""
        pending = self.loop.guard.step_async(
            step,
            loss=out.loss,
            grad_norm=out.grad_norm,
            tokens_per_s=tokens_per_s,
            data_time_s=out.data_time_s,  # R605
            step_time_s=self.interval,
            router_stats=self._router_reader(out),  # R601-R604, read with the step's values
        )
        if pending.resolved is not None and not self.settle(pending.resolved):
            return None
        return pending

    def _router_reader(self, out: StepResult) -> Callable[[], dict[str, dict]] | None:
        counts, math = out.router_counts, self.loop.math
        if counts is None:
            return None
        return lambda: math.router_stats_from(counts.tolist())

    def hold(self, step: int, row: dict[str, Any]) -> None:
        """Step `step`'s row, handed to the callbacks when its decision is read back."""
        self.held[step] = row

    def discard(self, step: int) -> None:
        self.held.pop(step, None)

    def flush(self) -> bool:
        """Settle the pending step now; False after a rollback."""
        decision = self.loop.guard.flush()
        return decision is None or self.settle(decision)

    def settle(self, decision: Decision) -> bool:
        """Act on a read-back decision as the host path acts on its own."""
        loop = self.loop
        if decision.rerun:
            self._rerun(decision)
        loop.ctx.record(decision.findings)
        row = self.held.pop(decision.step, None)
        if decision.action == "rollback":
            self.held.clear()
            self._last_start = None
            roll_back(loop, decision)
            return False
        decision.raise_if_halt()
        if row is not None:
            values = decision.values
            row |= {"loss": values.get("loss"), "grad_norm": values.get("grad_norm")}
            if "vetoed_by" not in row:  # a callback's veto stands whatever the guard said
                row |= {"action": decision.action}
            row |= {k: values[k] for k in MOE_COLUMNS if k in values}
            if row["action"] != "apply":
                row["lr"] = 0.0
            loop.callbacks.post_step(loop.ctx, decision.step, row)
        return True

    def _rerun(self, decision: Decision) -> None:
        """Recompute the suspect step (its update was skipped on the device, so the weights are
        those it saw) and keep the gradients of the step computed since, untouched."""
        loop = self.loop
        grads = [p.grad for p in loop.math.params]
        values = decision.values
        first = StepResult(values.get("loss"), values.get("grad_norm"), "", np.empty(0))  # type: ignore[arg-type]
        rerun(loop, decision, first, loop.sampler.position(decision.step))
        for p, g in zip(loop.math.params, grads, strict=True):
            p.grad = g
