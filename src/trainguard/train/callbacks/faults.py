"""The fire drills' faults (`TRAINGUARD_INJECT`, `trainguard.faults.FaultPlan`) as one callback
on the run's loop: the arithmetic of a step holds no fault calls, the hooks every callback has
drive them. Added only when a plan is active; last in order, so the watchdog and the straggler
timers hear of a phase before a fault acts in it.

    on_phase             kill@N:PHASE, hang@N, slow@N, slowdata@N, sleep@N/rR, slow@N/rR;
                         bitflip@N flips a weight as step N's first forward starts and puts it
                         back at the next phase (its backward has run by then)
    pre_step             collapse@N (the MoE routers)
    on_loss              nan@N, spike@N: the batch first read at step N is bad whenever read
    post_optimizer_step  bitflip@N/rR (after the update, before the replica check)
    on_checkpoint_write  kill@N:checkpoint_write (the write of the checkpoint saved after step N)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from trainguard.faults import FaultPlan
from trainguard.train.callback import Callback, RunContext


class FaultsCallback(Callback):
    name = "faults"
    priority = -100

    def __init__(
        self,
        plan: FaultPlan,
        position: Callable[[int], int],
        settle_writes: Callable[[], object],
        settle_copy: Callable[[], object],
    ) -> None:
        """`position(step)`: where step `step`'s global batch starts (the sampler's);
        `settle_writes`: waits for the checkpoint being written (a kill waits for it, so a
        drill's outcome does not depend on the disk's speed); `settle_copy`: waits for the
        background copy of the weights (a bit flip must not reach the previous checkpoint)."""
        self.plan = plan
        self.position = position
        plan.settle_writes, plan.settle_copy = settle_writes, settle_copy
        self._flipped = contextlib.ExitStack()  # a transient bit flip, undone at the next phase

    def pre_step(self, ctx: RunContext, step: int) -> None:
        self.plan.collapse_router(step, ctx.model)

    def on_phase(self, ctx: RunContext, phase: str, step: int) -> None:
        if phase != "backward":  # the flipped weight's forward and backward are done
            self._flipped.close()
        self.plan.at(phase, step)
        if phase == "forward":
            self._flipped.enter_context(self.plan.transient_bitflip(step, ctx.model))

    def on_loss(self, ctx: RunContext, step: int, loss: Any) -> Any:
        return self.plan.corrupt_loss(step, self.position(step), loss)

    def post_optimizer_step(self, ctx: RunContext, step: int) -> None:
        self.plan.corrupt_replica(step, ctx.model)

    def on_checkpoint_write(self, ctx: RunContext, step: int) -> None:
        self.plan.at("checkpoint_write", step - 1)  # checkpoint `step` is saved after step-1

    def close(self, ctx: RunContext) -> None:
        self._flipped.close()
