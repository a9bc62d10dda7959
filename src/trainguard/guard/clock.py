"""The step clock of the Guard: each step's seconds, and those spent getting its batch (R605).

In any loop, one process or many: `Guard.phase("data", step)` adds to the data time, and each
judged step takes the time since the previous one as its step time, unless the loop gives both.
"""

from __future__ import annotations

import time
from typing import Any

from trainguard.guard.arguments import metric_arg


class StepClock:
    def __init__(self) -> None:
        self.data_s = 0.0  # seconds in `phase("data")` since the last step
        self.timed_data = False
        self.last_step_at: float | None = None

    def add_data(self, seconds: float) -> None:
        self.data_s += seconds
        self.timed_data = True

    def times(self, data_time_s: Any, step_time_s: Any) -> dict[str, float | None]:
        """This step's data-phase and step seconds: as given, else what `phase("data")` timed
        since the last call and the time since the last call. Restarts the clock."""
        now = time.perf_counter()
        if data_time_s is None and self.timed_data:
            data_time_s = self.data_s
        if step_time_s is None and self.last_step_at is not None:
            step_time_s = now - self.last_step_at
        self.last_step_at, self.data_s, self.timed_data = now, 0.0, False
        if data_time_s is None:
            return {}
        return {
            "data_time_s": _seconds("data_time_s", data_time_s),
            "step_time_s": _seconds("step_time_s", step_time_s),
        }


def _seconds(name: str, x: Any) -> float | None:
    x = metric_arg(name, x)
    return float(x.item()) if hasattr(x, "item") else x
