"""R605: data-loader stalls, the data phase taking a large share of the step.

Input per step: `data_time_s` (seconds spent getting the batch: the sampler, the loader, the
reads) and `step_time_s` (the step's seconds, the data phase included). The share is their
ratio; the finding fires when the median share of the last `loader_window` steps reaches
`loader_share`, once per episode, re-armed when the median falls back below it.

Why a share and not a time: a slow step (R106) or a slow rank (H202) makes the whole step
longer and the data share smaller; only a loader that cannot keep up makes the data phase the
larger part of the step. The median keeps one slow batch (a cold cache, a page fault) quiet.
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.findings import Finding
from trainguard.guard.config import MonitorsConfig
from trainguard.guard.detectors.window import RollingWindow


class LoaderStallDetector:
    code = "R605"
    metric = "data_time_s"

    def __init__(self, config: MonitorsConfig | None = None) -> None:
        self.c = config or MonitorsConfig()
        self.shares = RollingWindow(self.c.loader_window)
        self.fired = False
        self.since: int | None = None

    def update(
        self, step: int, data_time_s: float | None, step_time_s: float | None
    ) -> list[Finding]:
        if data_time_s is None or step_time_s is None:
            return []
        if not (math.isfinite(data_time_s) and math.isfinite(step_time_s)) or step_time_s <= 0:
            return []
        share = min(1.0, max(0.0, data_time_s / step_time_s))
        self.shares.push(share)
        if len(self.shares) < self.c.loader_window:
            return []
        median = self.shares.median()
        if median < self.c.loader_share:
            self.fired, self.since = False, None
            return []
        if self.since is None:
            self.since = step
        if self.fired:
            return []
        self.fired = True
        return [
            Finding.of(
                self.code,
                f"the data loader is stalling training: the data phase took {median:.0%} of "
                f"the step (median of the last {self.c.loader_window} steps; "
                f"{data_time_s:.3g}s of {step_time_s:.3g}s at step {step}), at or above "
                f"guards.loader_share={self.c.loader_share:.0%}; the compute is waiting for "
                "batches",
                step=step,
                metric=self.metric,
                data={
                    "share": median,
                    "data_time_s": data_time_s,
                    "step_time_s": step_time_s,
                    "window": self.c.loader_window,
                },
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"shares": self.shares.state_dict(), "fired": self.fired, "since": self.since}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shares.load_state_dict(state["shares"])
        self.fired, self.since = bool(state["fired"]), state.get("since")
