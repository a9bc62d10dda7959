"""Which ranks are slow relative to the fleet: a pure function of the ranks' timings.

"Slow" is relative, never an absolute time, so a loaded machine or a smaller device does not
make every rank "slow":

- with `MANY` (8) or more ranks, a robust z-score: z = 0.6745 (t - median) / MAD (Iglewicz and
  Hoaglin's modified z-score; the median and the median absolute deviation ignore the outlier
  itself). A rank is slow when z > `Z_LIMIT` (3.5) AND t >= `MANY_MIN_RATIO` (1.25) x the
  median: identical devices time within a fraction of a percent of each other, so the MAD is
  tiny and a z-score alone would name a rank 2% slower;
- with fewer ranks the MAD says nothing (two ranks have no "typical" value), so a rank is slow
  when its time is at least `FEW_RATIO` (1.5) x the median of the OTHER ranks.

Only slowness is named: a fast outlier is not a fault.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MANY = 8
Z_LIMIT = 3.5
MANY_MIN_RATIO = 1.25
FEW_RATIO = 1.5
_MAD_SCALE = 0.6745  # the MAD of a normal distribution is 0.6745 standard deviations


@dataclass(frozen=True)
class Outlier:
    """A slow rank: its time, the fleet's reference time, their ratio and (many ranks) z."""

    rank: int
    seconds: float
    reference: float
    ratio: float
    z: float | None = None
    method: str = "ratio"

    def describe(self) -> str:
        how = f", robust z {self.z:.1f}" if self.z is not None else ""
        return f"{self.ratio:.2f}x the {self.method} reference {self.reference:.4g}s{how}"


def slow_ranks(times: dict[int, float]) -> list[Outlier]:
    """The slow ranks among `times` (rank -> seconds; larger is slower), sorted by rank.

    Ranks without a time (hung, failed) are simply absent from `times`.
    """
    values = {r: float(t) for r, t in times.items() if t is not None and t > 0}
    if len(values) < 2:
        return []
    if len(values) >= MANY:
        return _robust(values)
    return _few(values)


def _few(values: dict[int, float]) -> list[Outlier]:
    out = []
    for r, t in sorted(values.items()):
        others = statistics.median(v for q, v in values.items() if q != r)
        if t >= FEW_RATIO * others:
            out.append(Outlier(r, t, others, t / others, method="others' median"))
    return out


def _robust(values: dict[int, float]) -> list[Outlier]:
    med = statistics.median(values.values())
    mad = statistics.median(abs(v - med) for v in values.values())
    # All-equal timings (MAD 0) leave only the ratio test: the z-score is then unbounded.
    floor = max(mad, 1e-9 * med)
    out = []
    for r, t in sorted(values.items()):
        z = _MAD_SCALE * (t - med) / floor
        if z > Z_LIMIT and t >= MANY_MIN_RATIO * med:
            out.append(Outlier(r, t, med, t / med, z=z, method="fleet median"))
    return out
