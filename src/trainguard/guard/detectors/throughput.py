"""R106: throughput drops, tokens per second stuck well below their rolling median.

Single slow steps (a checkpoint write, an evaluation) are normal, so the detector needs
`patience` consecutive steps each at least `drop` below the median of the last `window` values
AND more than `z` robust standard deviations (IQR / 1.349) below it, both in log space
(throughput noise is multiplicative). The second condition keeps a machine whose throughput
swings by tens of percent from step to step (shared, oversubscribed CPUs) quiet: there a drop
of that size cannot be told from the noise, while a collapse still stands out. It fires once
per episode and re-arms when throughput recovers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trainguard.findings import Finding
from trainguard.guard.detectors.window import RollingWindow


class ThroughputDetector:
    code = "R106"

    def __init__(
        self,
        metric: str = "tokens_per_s",
        drop: float = 0.3,
        patience: int = 5,
        window: int = 64,
        min_history: int = 10,
        z: float = 3.0,
    ) -> None:
        self.metric = metric
        self.drop = drop
        self.z = z
        self.patience = patience
        self.min_history = min_history
        self.window = RollingWindow(window)
        self.low = 0
        self.since: int | None = None
        self.fired = False

    def update(self, step: int, metrics: Mapping[str, float | None]) -> list[Finding]:
        x = metrics.get(self.metric)
        if x is None or not math.isfinite(x) or x < 0:
            return []
        lx = math.log(x) if x > 0 else -math.inf  # zero throughput: a stall, as low as it gets
        out: list[Finding] = []
        if len(self.window) >= self.min_history:
            med = self.window.median()
            low = lx < med + math.log1p(-self.drop) and lx < med - self.z * (
                self.window.robust_sigma()
            )
            if low:
                self.low += 1
                if self.since is None:
                    self.since = step
                if self.low >= self.patience and not self.fired:
                    self.fired = True
                    m = math.exp(med)
                    out.append(
                        Finding.of(
                            self.code,
                            f"{self.metric} has been {x:.4g}, {1 - x / m:.0%} below its rolling "
                            f"median {m:.4g}, for {self.low} steps since step {self.since}",
                            step=step,
                            metric=self.metric,
                            data={
                                "value": float(x),
                                "median": float(m),
                                "drop": float(1 - x / m),
                                "since_step": self.since,
                                "steps": self.low,
                            },
                        )
                    )
            else:
                self.low, self.since, self.fired = 0, None, False
        if x > 0:
            self.window.push(lx)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "window": self.window.state_dict(),
            "low": self.low,
            "since": self.since,
            "fired": self.fired,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window.load_state_dict(state["window"])
        self.low, self.since, self.fired = int(state["low"]), state["since"], bool(state["fired"])
