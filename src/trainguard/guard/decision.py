"""What the loop must do with a step's update: `Decision` and its actions.

The actions in order of strength: apply < skip < rollback < halt; among a step's findings the
strongest action wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainguard.errors import RunHalted
from trainguard.findings import Finding
from trainguard.guard.config import ACTIONS, Action

STRENGTH = {a: i for i, a in enumerate(ACTIONS)}
# The codes `Guard.step_async` decides on the device: the only ones whose skip vetoes the
# update of the very step they score (guard/device.py).
DEVICE_CODES: tuple[str, ...] = ("R101", "R102", "R103")


@dataclass
class Decision:
    """What the loop must do with this step's update, and why."""

    step: int
    action: Action = "apply"
    findings: list[Finding] = field(default_factory=list)
    rerun: bool = False
    """Recompute this step from the same state and batch, then call `guard.classify_rerun`."""
    bad_steps: list[int] = field(default_factory=list)
    """With a rollback: the steps whose batches the replay must skip."""
    values: dict[str, float | None] = field(default_factory=dict)
    """The metrics the decision was taken on, as the host read them (for `step_async`, the
    first time the loop sees them on the host)."""

    @property
    def apply(self) -> bool:
        return self.action == "apply"

    def raise_if_halt(self) -> None:
        if self.action == "halt":
            why = "; ".join(str(f) for f in self.findings if f.severity != "info")
            raise RunHalted(
                f"the guard halted the run at step {self.step}: {why}",
                fix="read the findings above and the metrics log, then resume from the last "
                "checkpoint with a lower learning rate or the bad batches skipped",
            )
