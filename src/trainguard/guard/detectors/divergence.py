"""R104: divergence, a sustained rise of the smoothed loss above its best value.

The loss is smoothed by an exponential moving average (alpha = 2 / (span + 1)). Each input is
first clipped to twice the current average so that one spike cannot fake a rise (spikes are
R102's business). The detector fires once when the average stays more than `rise` above its
best value for `patience` consecutive steps, and re-arms when it falls back under that line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trainguard.findings import Finding


class DivergenceDetector:
    code = "R104"

    def __init__(
        self,
        metric: str = "loss",
        span: int = 50,
        rise: float = 0.1,
        patience: int = 20,
        min_steps: int = 50,
    ) -> None:
        self.metric = metric
        self.alpha = 2.0 / (span + 1)
        self.rise = rise
        self.patience = patience
        self.min_steps = min_steps
        self.seen = 0
        self.ema: float | None = None
        self.best: float | None = None
        self.best_step: int | None = None
        self.above = 0
        self.since: int | None = None
        self.fired = False

    def update(self, step: int, metrics: Mapping[str, float | None]) -> list[Finding]:
        x = metrics.get(self.metric)
        if x is None or not math.isfinite(x):
            return []
        self.seen += 1
        if self.ema is None:
            self.ema = float(x)
        else:
            if self.ema > 0:
                x = min(x, 2.0 * self.ema)
            self.ema += self.alpha * (x - self.ema)
        if self.seen < self.min_steps:
            return []
        if self.best is None or self.ema < self.best:
            self.best, self.best_step = self.ema, step
        # A rise relative to the best; for a loss near zero use an absolute floor so that
        # 1e-9 -> 2e-9 is not a "100% rise".
        line = self.best + self.rise * max(abs(self.best), 1e-6)
        if self.ema <= line:
            self.above, self.since, self.fired = 0, None, False
            return []
        self.above += 1
        if self.since is None:
            self.since = step
        if self.above < self.patience or self.fired:
            return []
        self.fired = True
        rel = (self.ema - self.best) / max(abs(self.best), 1e-6)
        return [
            Finding.of(
                self.code,
                f"smoothed {self.metric} {self.ema:.4g} has stayed above its best "
                f"{self.best:.4g} (step {self.best_step}) by more than {self.rise:.0%} "
                f"since step {self.since}: the run is diverging",
                step=step,
                metric=self.metric,
                data={
                    "ema": float(self.ema),
                    "best": float(self.best),
                    "best_step": self.best_step,
                    "since_step": self.since,
                    "rise": float(rel),
                },
            )
        ]

    _STATE = ("seen", "ema", "best", "best_step", "above", "since", "fired")

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in self._STATE:
            setattr(self, k, state[k])
