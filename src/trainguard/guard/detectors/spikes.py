"""R102/R103: loss and gradient-norm spikes scored against robust rolling statistics.

A value x is a spike when, against the last `window` finite values,
    z = (x - median) / sigma > z_threshold   and   x >= min_ratio * median,
with sigma = IQR / 1.349 (the robust standard deviation). Both conditions must hold: the z-test
keeps noisy series quiet, the ratio keeps near-constant series (tiny IQR) quiet. Nothing is
scored before `min_history` values (early training moves too fast for a baseline) or while the
median is not positive (a ratio is meaningless there). The value is pushed into the window
whether or not it spikes: the median ignores single spikes, and a genuine level shift is
absorbed after half a window instead of alarming forever.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trainguard.findings import Finding
from trainguard.guard.detectors.window import RollingWindow


class SpikeDetector:
    def __init__(
        self,
        metric: str = "loss",
        code: str = "R102",
        z_threshold: float = 6.0,
        min_ratio: float = 1.2,
        window: int = 64,
        min_history: int = 20,
    ) -> None:
        self.metric = metric
        self.code = code
        self.z_threshold = z_threshold
        self.min_ratio = min_ratio
        self.min_history = min_history
        self.window = RollingWindow(window)

    def threshold(self) -> tuple[float, float, float] | None:
        """(median, sigma, ratio line) of the window as it stands: what the next value is
        scored against, or None while it is not scored (too little history, median <= 0).

        Known before the value arrives, so a device can apply `spiked` to the value itself
        (guard/device.py) and agree with `update` exactly."""
        if len(self.window) < self.min_history:
            return None
        med = self.window.median()
        if med <= 0:
            return None
        # Floor sigma so a perfectly flat window does not divide by zero; the ratio test
        # already demands a real rise.
        sigma = max(self.window.robust_sigma(), 1e-12 * med)
        return med, sigma, self.min_ratio * med

    def spiked(self, x: Any, threshold: tuple[float, float, float]) -> Any:
        """The spike test of a finite `x` against `threshold()`: one expression for a Python
        float (a bool) and a float64 tensor on any device (a bool tensor, no host sync)."""
        med, sigma, line = threshold
        return (x >= line) & ((x - med) / sigma > self.z_threshold)

    def update(self, step: int, metrics: Mapping[str, float | None]) -> list[Finding]:
        x = metrics.get(self.metric)
        if x is None or not math.isfinite(x):
            return []  # R101's business; a NaN must not poison the window either
        out: list[Finding] = []
        threshold = self.threshold()
        if threshold is not None and self.spiked(x, threshold):
            med, sigma, _ = threshold
            z = (x - med) / sigma
            out.append(
                Finding.of(
                    self.code,
                    f"{self.metric} spiked to {x:.4g} at step {step}: {x / med:.2f}x the "
                    f"rolling median {med:.4g}, {z:.1f} robust standard deviations above",
                    step=step,
                    metric=self.metric,
                    data={
                        "value": float(x),
                        "median": float(med),
                        "sigma": float(sigma),
                        "z": float(min(z, 1e12)),
                        "ratio": float(x / med),
                        "window": len(self.window),
                    },
                )
            )
        self.window.push(float(x))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window.load_state_dict(state["window"])
