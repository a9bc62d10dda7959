"""R105's long-period test: a wave of hundreds to about a thousand steps, over the run's recent
history kept at a coarse stride.

A data-order wave can be slow (a shard of 400 steps) and faint (1-2% of the loss under 3% batch
noise). The window tests of oscillation.py cannot see it: their trend fits absorb any period
longer than a fifth of a window (a quarter of a half-window block for the faint-wave test). So:
1. History: every `stride` rows (window / 128: 8 rows by default) their mean step and mean value
   become one coarse point; the last POINTS = 512 are kept (4096 rows by default). The mean of a
   block of iid noise is iid, so the coarse noise stays white, and a wave of P rows keeps a
   known share of its amplitude, sin(pi s / P) / (s sin(pi / P)) for s = stride (0.90 at 4 points
   per period, the shortest tested), which the reported amplitude is divided by.
2. Trend: the same degree-5 polynomial in log(step + 1) as the window tests, over all points
   kept. Its flexibility is bounded by its degree, not by the span: six columns over 512 points
   can follow at most about two and a half cycles anywhere, and in log step they bend where the
   loss bends (warm-up, early fall) and are nearly straight late, where a steady wave spends
   most of its cycles. Frequencies from K_LO = 3 cycles over the span (periods up to a third of
   it: about 1365 rows by default, or a third of a shorter run) up to a quarter of the points
   (periods of 4 coarse points, 32 rows) are tested.
3. Significance (spectral.local_peak): the largest sum of two adjacent periodogram bins (a wave
   between them keeps its power) against the local noise level, the mean of the SIDE bins on
   each side, the four bins around the pair left out (where the wave's own leakage sits), the
   neighbourhood clipped at the band's low edge (the coarse noise is flat far past the band,
   even under AR(1) 0.9 batch noise). Local, because batch noise is not white: AR(1)-correlated
   noise or the trend's misfit tilt the spectrum, and only a peak that stands above its own
   neighbourhood is a wave; a mean, because its distribution is exact: under white noise the
   pair is Gamma(2) and the m background bins Gamma(m) in the same unit, so the ratio x = pair /
   (background / m) exceeds x with probability (1 + s)^-(m+1) (1 + s + m s), s = x / m
   (Fisher's reasoning with the noise level estimated beside the peak rather than from the
   whole band). Times the number of pairs (Bonferroni) it must be below `alpha`.
4. Stationarity, as the window tests: the period is refined on a fine grid between the bins
   (a refined period longer than a third of the span waits for more rows: an estimate at the
   band's edge came out 10% short), the wave is fitted jointly with the trend (so the
   polynomial's share of it, largest where it bends, is given back), once over the span and
   once per third; each third must carry between half and 1.5 times the whole's amplitude in
   its phase. A misfit of the trend (the warm-up's
   fall, a divergence starting) is lobes of changing size in one part and fails, as does a
   spike or a shift.
5. A period that is the alias of a shorter wave already reported (a wave of under 2 coarse
   points folds into the tested band) is not reported again.
The coarse point costs O(1) per row; the test, one least-squares fit and one FFT of 512 points,
runs every EVERY = 32 coarse points (256 rows by default): a constant amortised cost per step.

Why this way. Means rather than every stride-th row: a subsample folds all the noise (and any
short wave) into the band at full power, where means keep the noise white at 1/stride of its
variance and shrink short waves. A bounded span rather than the whole run: bounded memory and
cost, and a wave that starts mid-run (a new data order after a resume) is not diluted by the rows
before it; 4096 rows still hold three cycles of 1365 steps. One polynomial over the span rather
than per-block fits (step 6 of oscillation.py): a block's fit absorbs any period over a quarter of
the block. A local level of 2 x 16 bins: narrower costs power (the level's own noise: at alpha
1e-6 over ~125 pairs the threshold is x ~ 31 against ~ 22 for a known level), wider follows an
AR(1) tilt less closely. Measured in benchmarks/bench_long_wave.py (docs/benchmarks/long_wave.md):
detection and false alarms over many seeds, against the detector without this test.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from trainguard.guard.detectors.spectral import local_peak, trend_fit

POINTS = 512
"""Coarse points kept: the span of the long-period test is POINTS * stride rows."""
RESOLUTION = 128
"""Coarse points per window: stride = window // RESOLUTION rows per point."""
EVERY = 32
"""Coarse points between two long-period tests."""
K_LO = 3
SIDE = 16
_FINE = 32  # grid steps per bin when refining the period
_SHARE_MIN = 0.5
_SHARE_MAX = 1.5
_ALIAS_TOL = 0.15


class CoarseHistory:
    """Means of every `stride` rows (step and value), the last `points` of them."""

    def __init__(self, stride: int, points: int = POINTS) -> None:
        self.stride = max(int(stride), 1)
        self.steps: deque[float] = deque(maxlen=points)
        self.values: deque[float] = deque(maxlen=points)
        self._step_sum = 0.0
        self._value_sum = 0.0
        self._count = 0
        self.fresh = 0  # points added since the last test

    def add(self, step: int, value: float) -> None:
        self._step_sum += step
        self._value_sum += value
        self._count += 1
        if self._count == self.stride:
            self.steps.append(self._step_sum / self.stride)
            self.values.append(self._value_sum / self.stride)
            self._step_sum = self._value_sum = 0.0
            self._count = 0
            self.fresh += 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.values)
        return (
            np.fromiter(self.steps, dtype=np.float64, count=n),
            np.fromiter(self.values, dtype=np.float64, count=n),
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "stride": self.stride,
            "steps": list(self.steps),
            "values": list(self.values),
            "partial": [self._step_sum, self._value_sum, self._count],
            "fresh": self.fresh,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps.clear()
        self.values.clear()
        self._step_sum, self._value_sum, self._count = 0.0, 0.0, 0
        self.fresh = 0
        if int(state.get("stride", -1)) != self.stride:
            return  # another window: points of another size would mix; start afresh
        self.steps.extend(float(s) for s in state["steps"])
        self.values.extend(float(v) for v in state["values"])
        step_sum, value_sum, count = state["partial"]
        self._step_sum, self._value_sum, self._count = float(step_sum), float(value_sum), int(count)
        self.fresh = int(state["fresh"])


def find_slow_wave(
    steps: np.ndarray, values: np.ndarray, stride: int, alpha: float
) -> dict[str, float] | None:
    """The most significant wave in coarse points (means of `stride` rows each, oldest first),
    or None: {"period_steps", "amplitude", "p_value", "rows"}. Pure function."""
    fit = trend_fit(steps, values)
    if fit is None:
        return None
    y, design, resid = fit
    n = len(resid)
    spec = np.abs(np.fft.rfft(resid)) ** 2
    peak = local_peak(spec, K_LO, n // 4, (n - 1) // 2, SIDE, centred=False)
    if peak is None or peak[2] >= alpha:
        return None
    k, _, p_value = peak
    f = _refine(resid, float(k))
    if f < K_LO:
        return None  # fewer than K_LO cycles in the span: wait for the rows that tell its period
    joint = _joint_amplitudes(y, design, f, parts=3)
    if joint is None:
        return None
    whole, parts = joint
    shares = [(c * whole.conjugate()).real / abs(whole) ** 2 for c in parts]
    if min(shares) < _SHARE_MIN or max(shares) > _SHARE_MAX:
        return None
    per = n / f  # coarse points per period
    kept = math.sin(math.pi / per) / (stride * math.sin(math.pi / (per * stride)))
    step_stride = max(float(np.median(np.diff(steps))), 1e-12)  # steps per coarse point
    return {
        "period_steps": per * step_stride,
        "amplitude": abs(whole) / kept,
        "p_value": p_value,
        "rows": float(n * stride),
    }


def _refine(resid: np.ndarray, k: float) -> float:
    """The frequency (bins) in [k - 0.5, k + 1.5] where the residual's DFT is largest, on a
    grid of 1 / _FINE bin (a zero-padded FFT)."""
    fine = np.abs(np.fft.rfft(resid, n=_FINE * len(resid)))
    lo, hi = int(_FINE * k) - _FINE // 2, int(_FINE * (k + 1)) + _FINE // 2
    return (lo + int(np.argmax(fine[lo : hi + 1]))) / _FINE


def _joint_amplitudes(
    y: np.ndarray, design: np.ndarray, f: float, parts: int
) -> tuple[complex, list[complex]] | None:
    """The wave at frequency f (bins) fitted with the trend: its complex amplitude over the whole
    span, and in each of `parts` consecutive parts (one cosine and sine pair per part)."""
    n = len(y)
    phase = 2.0 * np.pi * f * np.arange(n) / n
    cos, sin = np.cos(phase), np.sin(phase)
    coef, *_ = np.linalg.lstsq(np.column_stack([design, cos, sin]), y, rcond=None)
    whole = complex(coef[-2], coef[-1])
    if abs(whole) == 0:
        return None
    cols = [design]
    for idx in np.array_split(np.arange(n), parts):
        mask = np.zeros(n)
        mask[idx] = 1.0
        cols += [(cos * mask)[:, None], (sin * mask)[:, None]]
    coef, *_ = np.linalg.lstsq(np.hstack(cols), y, rcond=None)
    tail = coef[design.shape[1] :]
    return whole, [complex(tail[2 * j], tail[2 * j + 1]) for j in range(parts)]


def is_alias(period: float, reported: Sequence[float], point_steps: float) -> bool:
    """Whether `period` (steps) is where a reported shorter wave folds at one coarse point per
    `point_steps` steps."""
    for p in reported:
        f = point_steps / p  # cycles per coarse point
        folded = abs(f - round(f))
        if f > 0.5 and folded > 0 and abs(point_steps / folded - period) <= _ALIAS_TOL * period:
            return True
    return False
