"""What `Guard.judge` returns and what `Guard.settle` did: the two halves of the one guard
protocol, the same on the host path and on the device path.

    j = guard.judge(step, loss=loss, model=model, optimizer=optimizer)  # before the update
    done = guard.settle(j, rerun=recompute, checkpointer=ckpt, state=state, sampler=sampler)
    if done.rolled_back_to is not None: ...           # continue from there
    j.optimizer_step(optimizer)                       # applied, skipped or masked, as judged

On the host path the Judgement holds this step's `decision` (its values read with one host sync
each); on the device path (`guards.decide_on`) the verdict is `ok`, a 0-dim bool tensor the
update is masked by, and `resolved` is the previous step's decision, read back by this call.
`known` is whichever of the two the loop can act on now: `settle` acts on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainguard.guard.decision import Decision

if TYPE_CHECKING:  # torch: imported when a step is masked, not with the Guard
    from trainguard.guard.masked_step import HostRepair, MaskedUpdate


@dataclass
class Judgement:
    """One step's verdict before its update (`Guard.judge`; `Guard.step_async` returns one
    too, as `guard.device.PendingStep`)."""

    step: int
    ok: Any = None
    """Device path: a 0-dim bool tensor on the metrics' device, the update may be applied.
    None on the host path, when the guard is disabled or when the step was dropped."""
    resolved: Decision | None = None
    """Device path: the previous pending step's decision, read back by this call."""
    dropped: bool = False
    """Device path: the previous step asked for a rollback or a halt, so this step was not
    judged and its update must not be applied."""
    repair: HostRepair | None = None
    decision: Decision | None = None
    """Host path: this step's decision."""
    model: Any = field(default=None, repr=False)
    """The model judged (its gradients are set aside while `settle` reruns a step)."""
    _mask: MaskedUpdate | None = field(default=None, repr=False)

    @property
    def known(self) -> Decision | None:
        """The decision the loop can act on now: this step's (host path) or the previous
        step's, read back now (device path); None when there is none yet."""
        return self.decision if self.decision is not None else self.resolved

    @property
    def on_device(self) -> bool:
        return self.decision is None

    def optimizer_step(self, optimizer: Any) -> None:
        """`optimizer.step()` as judged: on the host path only when the decision applies the
        update (otherwise the gradients are cleared); on the device path always, masked by `ok`
        (guard/masked_step.py). Use this instead of `optimizer.step()`: on the device path a
        plain step would apply a rejected update."""
        if self.dropped:
            raise RuntimeError(
                f"step {self.step} was dropped: act on the previous step's decision "
                f"({self.resolved.action if self.resolved else '?'}) first (guard.settle)"
            )
        if self.decision is not None and not self.decision.apply:
            optimizer.zero_grad(set_to_none=True)
        elif self.ok is None:
            optimizer.step()
        else:
            from trainguard.guard.masked_step import masked_step

            self.repair = masked_step(optimizer, self.ok)

    def begin_update(self, optimizer: Any) -> None:
        """For a framework that calls `optimizer.step()` itself (the Trainer adapters): from
        here to `end_update()` its step does what `optimizer_step` would. A rejected or dropped
        step has its gradients cleared (torch optimizers then pass over every parameter); a
        device verdict masks the step."""
        skip = self.dropped or (self.decision is not None and not self.decision.apply)
        if skip:
            optimizer.zero_grad(set_to_none=True)
        elif self.ok is not None:
            from trainguard.guard.masked_step import MaskedUpdate

            self._mask = MaskedUpdate(optimizer, self.ok)

    def end_update(self) -> None:
        """After the framework's `optimizer.step()`: the mask ends (what the host must undo if
        `ok` turns out false is kept in `repair`, undone at read-back)."""
        if self._mask is not None:
            mask, self._mask = self._mask, None
            self.repair = mask.end()


@dataclass
class Settled:
    """What `Guard.settle` did with a decision."""

    decision: Decision | None = None
    """The decision settled (None: nothing was known yet); with a rerun, its R205/R206
    verdict is among its findings."""
    rolled_back_to: int | None = None
    """A rollback done here: the step to continue from (`sampler.set_step` it, then a new
    iterator over the loader)."""
    stop: bool = False
    """A rollback or halt left to the caller (`settle(..., defer=True)`): stop the framework's
    loop, then `guard.rollback(...)` or `decision.raise_if_halt()`."""

    @property
    def action(self) -> str | None:
        return None if self.decision is None else self.decision.action

    @property
    def findings(self) -> list[Any]:
        return [] if self.decision is None else self.decision.findings
