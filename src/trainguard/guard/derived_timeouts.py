"""Timeouts from the run itself: a multiple of a high percentile of the observed step times.

    timeout = max(floor, min(ceiling, factor * p_q(last WINDOW step times)))

with the default q = 99 and factor = 10 (distributed section): a hang in a 1 s step is named
after about 10-15 s rather than after the fixed 300 s + 60 s. Until `min_samples` steps have been
seen there is no derived value and the caller keeps its fixed (start-up) timeout. Steps that ran
a checkpoint or an evaluation are not step times: those phases have budgets of their own.

One rule for the hang watchdog (R210, its median: q = 50) and the distributed guards (the
collective timeout of the gradient group and the monitored barriers, R301).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

WINDOW = 128
MIN_SAMPLES = 5


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between the closest ranks."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0-100")
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def derived_timeout(
    durations: Iterable[float],
    *,
    factor: float,
    q: float,
    floor_s: float,
    ceiling_s: float = math.inf,
    min_samples: int = MIN_SAMPLES,
) -> float | None:
    """max(floor_s, min(ceiling_s, factor * p_q(durations))), or None with fewer than
    `min_samples` durations. A ceiling below the floor lowers the floor: a derived timeout
    never waits longer than the fixed value it replaces (a user's short fixed timeout stands)."""
    xs = list(durations)
    if len(xs) < min_samples:
        return None
    return max(min(floor_s, ceiling_s), min(ceiling_s, factor * percentile(xs, q)))


class StepTimes:
    """The recent step times of a loop, measured between step boundaries; a step during which
    a budget phase (checkpoint, eval) ran is left out."""

    def __init__(self, window: int = WINDOW) -> None:
        self.durations: deque[float] = deque(maxlen=window)
        self._last: float | None = None
        self._skip = False

    def boundary(self, now: float) -> None:
        """A step ended at `now` (a monotonic clock)."""
        if self._last is not None and not self._skip:
            self.durations.append(now - self._last)
        self._last = now
        self._skip = False

    def skip_this_step(self) -> None:
        """The current step ran a checkpoint or an evaluation: not a step time."""
        self._skip = True
