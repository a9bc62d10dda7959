"""`trainguard run` with the guard deciding on the device (`guards.decide_on`; on CUDA by
default): the loop never waits for the device inside a step.

Per step, `judge` gives the step's loss and gradient norm (device tensors) to
`Guard.step_async`, which masks the update on the device (guards/device.py), and settles the
previous step: its findings, its rerun, its rollback or halt, and its metrics row, held until its
values are read back. `flush` settles the current step at once: the loop calls it before what
must see a settled run (a checkpoint, an evaluation, a replica rollback, the end). What is
settled, and how, is what the synchronous loop does with its own decision; only when changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trainguard.guards.decision import Decision
from trainguard.guards.device import PendingStep
from trainguard.train.actions import StepPositions, rerun_to_classify, rollback
from trainguard.train.loop import StepResult, Trainer

MOE_COLUMNS = ("moe_drop_frac", "moe_load_max", "moe_load_min")  # monitors.moe.router_summary

if TYPE_CHECKING:
    from trainguard.findings import Finding
    from trainguard.guard import Guard
    from trainguard.metrics.sinks import MetricsFanout
    from trainguard.train.metrics import ProgressDisplay


class RunView(Protocol):
    """What settling a step uses of the run (its session provides it, and is handed on to
    `train/actions.py`): only the command line imports `train/run.py` (docs/architecture.md)."""

    guard: Guard
    trainer: Trainer
    is_main: bool
    metrics: MetricsFanout
    display: ProgressDisplay

    def record(self, findings: list[Finding]) -> None: ...


class DeviceSteps:
    def __init__(self, session: RunView) -> None:
        self.session = session
        self.held: dict[int, dict[str, Any]] = {}  # step -> its metrics row, values to come
        self._last_start: float | None = None
        self.interval = 0.0  # seconds between the last two step starts: the step's time

    def tokens_per_s(self, tokens: int, t0: float) -> float:
        """Tokens over the time between consecutive step starts. The host waits for the device
        a step late, so in steady state this is the device's pace; the time to queue one step's
        kernels (what `t0` to now measures here) is not."""
        last, self._last_start = self._last_start, t0
        self.interval = max((t0 - last) if last is not None else time.perf_counter() - t0, 1e-9)
        return tokens / self.interval

    def judge(
        self, step: int, out: StepResult, tokens_per_s: float, positions: StepPositions
    ) -> PendingStep | None:
        """This step judged on the device, the previous one settled; None after a rollback."""
        pending = self.session.guard.step_async(
            step,
            loss=out.loss,
            grad_norm=out.grad_norm,
            tokens_per_s=tokens_per_s,
            data_time_s=out.data_time_s,  # R605
            step_time_s=self.interval,
            router_stats=self._router_reader(out),  # R601-R604, read with the step's values
        )
        if pending.resolved is not None and not self.settle(pending.resolved, positions):
            return None
        return pending

    def _router_reader(self, out: StepResult) -> Callable[[], dict[str, dict]] | None:
        counts, trainer = out.router_counts, self.session.trainer
        if counts is None:
            return None
        return lambda: trainer.router_stats_from(counts.tolist())

    def hold(self, step: int, row: dict[str, Any]) -> None:
        """Step `step`'s metrics row, written when its decision is read back."""
        self.held[step] = row

    def discard(self, step: int) -> None:
        self.held.pop(step, None)

    def flush(self, positions: StepPositions) -> bool:
        """Settle the pending step now; False after a rollback."""
        decision = self.session.guard.flush()
        return decision is None or self.settle(decision, positions)

    def settle(self, decision: Decision, positions: StepPositions) -> bool:
        """Act on a read-back decision as the synchronous loop acts on its own."""
        s = self.session
        if decision.rerun:
            self._rerun(decision, positions)
        s.record(decision.findings)
        row = self.held.pop(decision.step, None)
        if decision.action == "rollback":
            self.held.clear()
            self._last_start = None
            rollback(s, decision, positions)
            return False
        decision.raise_if_halt()
        if row is not None:
            values = decision.values
            row |= {"loss": values.get("loss"), "grad_norm": values.get("grad_norm")}
            row |= {"action": decision.action}
            row |= {k: values[k] for k in MOE_COLUMNS if k in values}
            if decision.action != "apply":
                row["lr"] = 0.0
            if s.is_main:
                s.metrics.write(row)
            s.display.update(decision.step, row["loss"], row["tokens_per_s"])
        return True

    def _rerun(self, decision: Decision, positions: StepPositions) -> None:
        """Recompute the suspect step (its update was skipped on the device, so the weights are
        those it saw) and keep the gradients of the step computed since, untouched."""
        s = self.session
        position = positions.get(decision.step)
        if position is None:
            return
        grads = [p.grad for p in s.trainer.params]
        values = decision.values
        first = StepResult(values.get("loss"), values.get("grad_norm"), "", np.empty(0))  # type: ignore[arg-type]
        rerun_to_classify(s, decision, first, position)
        for p, g in zip(s.trainer.params, grads, strict=True):
            p.grad = g
