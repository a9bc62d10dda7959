"""The multi-process guards' wiring in `trainguard run` (`guards.DistributedGuards`, the part a
user's torchrun loop gets through `Guard(distributed=True)`). The loop drives the part through
its `Guard`: `guard.phase` around the forward/backward (a collective that fails there becomes
the hung-rank diagnosis, R301) and `guard.end_step` after the update (replica hashes, H201, and
straggler scores, H202, then the monitored barrier). This callback does the rest:

- arms the SIGTERM stack dump for the run (the launcher stops the ranks of a failed job with
  SIGTERM; the hung one among them writes its stacks first) and disarms it at the end;
- marks every phase for the straggler timings (eval and checkpoint pause them);
- after a long phase (an evaluation, a checkpoint), meets every rank at a barrier with the long
  sync timeout before the next step's short-timeout collectives;
- logs the gathered per-rank timings (`rank_timings` events, read by `trainguard watch`).

With one process every call is a no-op. The part's state (straggler windows, replica rollback
count) is saved with the guard that owns it (trainer.json's `guard.distributed`).
"""

from __future__ import annotations

from typing import Any

from trainguard.guard.distributed.guards import DistributedGuards
from trainguard.train.callback import Callback, RunContext

LONG_PHASES = ("eval", "checkpoint")


class DistributedGuardsCallback(Callback):
    name = "distributed"
    priority = 70

    def __init__(self, part: DistributedGuards) -> None:
        self.part = part
        self._long_phase = False  # an evaluation or a checkpoint since the last barrier

    def pre_train(self, ctx: RunContext) -> None:
        self.part.start()

    def on_phase(self, ctx: RunContext, phase: str, step: int) -> None:
        self.part.mark(phase)
        self._long_phase = self._long_phase or phase in LONG_PHASES

    def pre_step(self, ctx: RunContext, step: int) -> None:
        if self._long_phase:
            self._long_phase = False
            self.part.sync(step)  # host sync: every rank waits here for the slowest

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        if self.part.last_timings is not None:
            ctx.log_event("rank_timings", timings=self.part.last_timings)

    def close(self, ctx: RunContext) -> None:
        self.part.close()
