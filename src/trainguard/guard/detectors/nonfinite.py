"""R101: a non-finite loss or gradient norm, seen before the optimizer applies the update."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trainguard.findings import Finding


class NonFiniteDetector:
    """Fires on every step whose `metric` is NaN or +-Inf. Stateless apart from a counter."""

    code = "R101"

    def __init__(self, metric: str = "loss") -> None:
        self.metric = metric
        self.count = 0

    def update(self, step: int, metrics: Mapping[str, float | None]) -> list[Finding]:
        x = metrics.get(self.metric)
        if x is None or math.isfinite(x):
            return []
        self.count += 1
        return [
            Finding.of(
                self.code,
                f"{self.metric} is {x} at step {step}; the update must not be applied",
                step=step,
                metric=self.metric,
                data={"value": str(x), "count": self.count},
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["count"])
