"""The hang watchdog of `trainguard run` (`guard/watchdog.py`): started before the first
step, told every phase and every finished step, stopped when the run ends. A step that stops
making progress (a deadlock, a stuck collective, an injected `hang@N`) is dumped with its phase
and the process exits 3 for a restart (R210); `on_timeout(finding)` runs first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.findings import Finding
from trainguard.guard.watchdog import Watchdog
from trainguard.train.callback import Callback, RunContext


class WatchdogCallback(Callback):
    name = "watchdog"
    priority = 60

    def __init__(
        self,
        run_dir: Path,
        guards: Any,  # the recipe's GuardsConfig: hang_floor_s, hang_factor, hang_window
        rank: int | None,
        on_timeout: Callable[[Finding], None] | None = None,
    ) -> None:
        floor = guards.hang_floor_s
        self.watchdog = Watchdog.from_config(
            run_dir,
            guards,
            rank=rank,
            on_timeout=on_timeout,
            # The first step compiles and warms caches; checkpoints and evals are long.
            phase_floors={"startup": 4 * floor, "checkpoint": 4 * floor, "eval": 4 * floor},
        )

    def pre_train(self, ctx: RunContext) -> None:
        self.watchdog.start()

    def on_phase(self, ctx: RunContext, phase: str, step: int) -> None:
        self.watchdog.set_phase(phase)

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        self.watchdog.heartbeat(step)

    def stop(self) -> None:
        """Stop watching (idempotent): also before exiting for a hang found elsewhere, so that
        the backstop does not fire later."""
        self.watchdog.stop()

    def close(self, ctx: RunContext) -> None:
        self.stop()
