"""A fixed-size rolling window kept both in arrival order and sorted.

The sorted copy gives the median and quartiles in O(1); insert and evict are a binary search
plus a memmove of at most `size` floats, so a step costs about a microsecond for the windows
used here (64 values) and never grows with the run's length.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from typing import Any

# IQR of a normal distribution in standard deviations: sigma ~= IQR / 1.349.
IQR_TO_SIGMA = 1.349


class RollingWindow:
    def __init__(self, size: int) -> None:
        self.size = size
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._order)

    def push(self, x: float) -> None:
        if len(self._order) == self.size:
            old = self._order.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self._order.append(x)
        insort(self._sorted, x)

    def quantile(self, q: float) -> float:
        """Nearest-rank-interpolated quantile of the window (callers ensure it is non-empty)."""
        s = self._sorted
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    def median(self) -> float:
        s = self._sorted  # called every step: the direct form of quantile(0.5)
        n = len(s)
        h = n // 2
        return s[h] if n % 2 else 0.5 * (s[h - 1] + s[h])

    def robust_sigma(self) -> float:
        """The standard deviation a normal distribution with this window's IQR would have."""
        return (self.quantile(0.75) - self.quantile(0.25)) / IQR_TO_SIGMA

    def state_dict(self) -> dict[str, Any]:
        return {"size": self.size, "values": list(self._order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._order = deque()
        self._sorted = []
        for x in state["values"][-self.size :]:
            self.push(float(x))
