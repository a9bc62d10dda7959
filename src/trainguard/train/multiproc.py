"""`trainguard run`'s adapter over the public `guards.DistributedGuards`: the same replica
checks (H201), straggler scores (H202) and hung-rank diagnosis (R301) a user's torchrun loop
gets, plus what only the run has: the drills' injected replica fault, the metric log, the
progress display and the hang watchdog it must stop before exiting for a hang.

`RunSession` calls, per step: `timed(phase)` at phase boundaries (via the trainer's on_phase),
`guarded(fn)` around the forward/backward (collective failures become a diagnosis),
`check_update(step, checkpoint_due)` after the update, `after_step(step)` at the step boundary,
and `sync()` after evaluations and checkpoint saves. With one process every call is a no-op.
The part's state (straggler windows, replica rollback count) is saved through the run's `Guard`,
which owns it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from trainguard.errors import RunHalted
from trainguard.findings import Finding
from trainguard.guards.distributed import DistributedGuards
from trainguard.train.outcome import report_hang

if TYPE_CHECKING:
    from trainguard.train.run import RunSession

T = TypeVar("T")


class MultiProcessGuards:
    def __init__(self, session: RunSession) -> None:
        self.session = session
        self.dist = session.dist
        self.part = DistributedGuards(
            self.dist.config,
            run_dir=session.run_dir,
            max_rollbacks=session.recipe.guards.max_rollbacks,
            group=self.dist.group,
            on_hang=self._on_hang,
            agree_metrics=False,  # the trainer all-reduces the loss (and DDP the gradients)
        )

    def arm_sigterm_dump(self) -> None:
        self.part.start()

    def disarm_sigterm_dump(self) -> None:
        self.part.close()

    def timed(self, phase: str) -> None:
        self.part.mark(phase)

    def guarded(self, step: int, fn: Callable[..., T], *args: Any) -> T:
        return self.part.guarded(step, fn, *args)

    def check_update(self, step: int, checkpoint_due: bool) -> list[Finding]:
        """After the update: the injected replica fault, then the replica check when due."""
        s = self.session
        if s.faults.corrupt_replica(step, s.model):
            s.display.message(f"fault: flipped a bit in rank {self.dist.world.rank}'s weights")
        found = self.part.after_update(step, s.model, s.optimizer, checkpoint_due=checkpoint_due)
        diverged = [f for f in found if f.code == "H201"]
        s.record([f for f in found if f.code != "H201"])
        if diverged and self.part.replica_limit_reached:
            s.record(diverged)
            raise RunHalted(
                f"replicas diverged {self.part.replica_rollbacks} times (H201); the last: "
                f"{diverged[0].message}",
                "drain the named hosts and restart; raise guards.max_rollbacks to retry more",
            )
        return diverged

    def after_step(self, step: int) -> list[Finding]:
        found = self.part.after_step(step)
        if self.part.last_timings is not None:
            self.session.log_event("rank_timings", timings=self.part.last_timings)
        return found

    def sync(self, step: int) -> None:
        self.part.sync(step)

    def _on_hang(self, finding: Finding) -> None:
        self.session.record([finding])
        self.session.display.message(str(finding))
        report_hang(self.session, finding)
        if self.session.watchdog is not None:
            self.session.watchdog.stop()  # we exit for it; its backstop must not fire later
