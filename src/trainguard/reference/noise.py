"""The reference curve's own noise: how far single steps scatter around its smoothed course.

The smoothed value at a step is the straight line through its two neighbours; the residual
r_t = x_t - (x_{t-1} + x_{t+1}) / 2 then cancels any locally linear trend, so the steep early
descent does not pass for noise, and the noise is the robust scale of the residuals (1.4826 x
their median absolute deviation, robust to the occasional outlier batch), divided by sqrt(1.5)
because r_t mixes three steps' scatter (var r = 1.5 sigma^2 for independent steps). That is
the batch-to-batch scatter of the recipe at its steps, the unit the comparison measures
departures in. (A running median would follow a steep monotone stretch exactly and call it
noise-free: on a 20-step curve it returned zero.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# A noise below this fraction of the loss is treated as this fraction: a curve that is smooth
# to the last bit (a synthetic one, a huge batch) must not turn rounding into departures.
RELATIVE_FLOOR = 1e-4


@dataclass(frozen=True)
class Noise:
    sigma: float
    """Robust scale of a step's scatter around the smoothed curve, in loss units (nats)."""

    def to_dict(self) -> dict[str, float]:
        return {"sigma": self.sigma}


def learn_noise(loss: Sequence[float]) -> Noise:
    """The noise of a curve of at least three finite losses."""
    x = np.asarray(loss, dtype=np.float64)
    residual = x[1:-1] - (x[:-2] + x[2:]) / 2.0
    mad = float(np.median(np.abs(residual - np.median(residual))))
    floor = RELATIVE_FLOOR * float(np.median(np.abs(x)))
    return Noise(sigma=max(1.4826 * mad / math.sqrt(1.5), floor, 1e-12))
