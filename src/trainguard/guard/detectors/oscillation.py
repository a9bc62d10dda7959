"""R105: a periodic wave in the loss, the signature of a poorly shuffled data order.

Every `interval` rows the last `window` rows are tested:
1. Detrend: fit a degree-5 polynomial in log(step) to log(loss) by least squares (a power law
   with warm-up and a cosine schedule is smooth in those coordinates) and keep the residual.
   Log units make the amplitude relative: 0.01 means a 1% wave (spectral.py).
2. Periodogram of the residual (no taper, so bins are independent under white noise), over
   frequencies k = 9 .. (n-1)//2: periods from n/9 rows (114 for a full window) down to two
   rows. Slower waves are the long-period test's (step 7): the polynomial absorbs part of them
   here, and the noise level of step 3 needs bins on both sides of a pair.
3. Significance (spectral.local_peak): the largest sum of two adjacent bins (a wave between
   them keeps its power) over the mean of up to SIDE = 16 bins on each side, as many below as
   above, within k >= 4 (below, the trend fit has removed power) and with the four around the
   pair left out. Under noise that is white near the pair, the pair is Gamma(2) and the
   background mean of m bins Gamma(m)/m in the same unit, so P(ratio > x) = (1 + s)^-(m+1)
   (1 + s + m s), s = x/m, exactly; times the number of pairs it must be below `alpha`, and the
   amplitude at least `min_amplitude`. This is Fisher's reasoning (a peak beyond what the largest
   of m noise bins reaches) with the noise level measured beside the peak: Fisher's g divides by
   the whole band, which assumes white noise, and batch noise is often not white. AR(1)-
   correlated noise (0.5-0.9) tilts the spectrum several-fold across the band, and the g-test
   raised R105 on every such clean curve in benchmarks/bench_long_wave.py; a tilt is no peak
   over its own neighbourhood, and a wave is. The neighbourhood is centred because a red
   spectrum is convex: a centred mean then lies above the pair's own level (conservative), a
   one-sided one below it.
4. Stationarity: a wave from the data order persists with a fixed period and phase, so the
   component, measured in each third of the window against the whole window's phase, must
   keep between half and 1.5 times its amplitude there. Trend misfit (the fast fall after
   warm-up, the bend where a divergence starts) is lobes of changing size and sign, often
   piled up in one third, and fails this even when the residual has no noise at all.
5. The period is refined on an 8x zero-padded, Hann-tapered spectrum, converted from rows to
   steps (rows may be logged every k steps), and compared with the known data period P: it
   matches when it is within 10% of P / h for a harmonic h in 1..4.
6. A faint wave (0.5% of the loss under 2% batch noise) stays below the noise of one window's
   periodogram, but a wave from the data order lasts the whole run with one period and phase,
   and the power of a steady sinusoid in a periodogram grows with its length while the noise
   per bin does not. So each completed block of window/2 rows is detrended on its own (step 1)
   and kept, and the residuals of the last K = 2 .. 8 blocks (up to 4096 rows) are joined into
   one periodogram, over periods up to a quarter of a block (less the centred neighbourhood's
   first bins), tested as in step 3 with up to SIDE * K bins on each side (the same width in
   frequency), Bonferroni over the K tried; every block must
   carry at least a quarter of the wave's amplitude in phase (as step 4: a misfit in one block
   cannot pass). The period is refined by a parabola through the log powers around the peak.
7. A slow wave (hundreds to about a thousand steps: a shard of 400 steps at 1-2% under 3%
   noise) is absorbed by every trend fit above; slow_wave.py tests the last 4 windows kept as
   means of window/128 rows, periods up to a third of the rows seen (its docstring says how).
The fit and FFT cost O(n log n) every `interval` rows, plus, every window/2 rows, one fit and
at most 7 FFTs of up to 4096 rows for the faint-wave test, plus the long-period test's fit and
FFT of 512 points every 32 coarse points: a constant amortised cost per step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trainguard.findings import Finding
from trainguard.guard.detectors.slow_wave import (
    EVERY,
    RESOLUTION,
    CoarseHistory,
    find_slow_wave,
    is_alias,
)
from trainguard.guard.detectors.spectral import MIN_ROWS, detrended, local_peak
from trainguard.guard.detectors.spectral import component as _component
from trainguard.guard.detectors.spectral import peak_bin as _peak_bin

__all__ = [
    "MIN_ROWS",
    "OscillationDetector",
    "detrended",
    "find_long_wave",
    "find_wave",
    "match_data_period",
]

BLOCKS = 8
"""Completed blocks (half a window each) the faint-wave test joins at most."""
_BLOCK_SHARE = 0.25
_K_MIN = 4
SIDE = 16
"""Bins on each side of a pair that give its noise level (spectral.local_peak)."""
_K_MIN_BLOCK = 4
_PAD = 8
_THIRDS_MIN = 0.5
_THIRDS_MAX = 1.5
_MATCH_TOL = 0.1


def find_wave(steps: np.ndarray, values: np.ndarray, alpha: float) -> dict[str, float] | None:
    """The most significant periodic component of `values` over `steps`, or None.

    Returns {"period_steps", "amplitude", "p_value", "x"} when a pair of bins stands above its
    neighbourhood beyond chance at `alpha` (steps 2-3) and the wave is present throughout;
    pure function, used online and offline.
    """
    resid = detrended(steps, values)
    if resid is None:
        return None
    n = len(resid)
    spec = np.abs(np.fft.rfft(resid)) ** 2
    peak = local_peak(spec, _K_MIN, n, (n - 1) // 2, SIDE)
    if peak is None or peak[2] >= alpha:
        return None
    k, x, p_value = peak
    k += 1 if spec[k + 1] > spec[k] else 0
    amplitude = 2.0 * math.sqrt(float(spec[k])) / n
    # The same wave in each third: same amplitude and phase. Projected on the whole window's
    # phase, each third must carry at least half the amplitude.
    whole = _component(resid, np.arange(n), k, n)
    unit = whole / abs(whole)
    thirds = [_component(resid, part, k, n) for part in np.array_split(np.arange(n), 3)]
    shares = [(t * unit.conjugate()).real / abs(whole) for t in thirds]
    if min(shares) < _THIRDS_MIN or max(shares) > _THIRDS_MAX:
        return None
    # Refine the frequency between bins on a zero-padded tapered spectrum near the peak.
    w = np.hanning(n)
    fine = np.abs(np.fft.rfft(resid * w, n=_PAD * n))
    lo, hi = max(1, _PAD * (k - 1)), min(len(fine) - 1, _PAD * (k + 1))
    j = lo + int(np.argmax(fine[lo : hi + 1]))
    stride = float(np.median(np.diff(steps)))
    return {
        "period_steps": _PAD * n / j * max(stride, 1e-12),
        "amplitude": max(amplitude, 2.0 * float(fine[j]) / float(w.sum())),
        "p_value": p_value,
        "x": x,
    }


def find_long_wave(
    blocks: Sequence[np.ndarray], stride: float, alpha: float
) -> dict[str, float] | None:
    """The faint-wave test (step 6) over the detrended residuals of consecutive blocks, oldest
    first: the most significant wave of the last K = 2 .. len(blocks) blocks, or None."""
    best: dict[str, float] | None = None
    tries = max(len(blocks) - 1, 1)  # Bonferroni over the K tried
    for k_blocks in range(2, len(blocks) + 1):
        wave = _long_wave(blocks[-k_blocks:], stride, alpha / tries)
        if wave is not None:
            wave["p_value"] = min(1.0, wave["p_value"] * tries)
            if best is None or wave["p_value"] < best["p_value"]:
                best = wave
    return best


def _long_wave(
    blocks: Sequence[np.ndarray], stride: float, alpha: float
) -> dict[str, float] | None:
    resid = np.concatenate(blocks)
    n, parts = len(resid), len(blocks)
    spec = np.abs(np.fft.rfft(resid)) ** 2
    # Slower than a quarter of a block is the trend's; the neighbourhood is as wide in periods as
    # the window test's, so SIDE bins per block joined.
    peak = local_peak(spec, _K_MIN_BLOCK * parts, n, (n - 1) // 2, SIDE * parts)
    if peak is None or peak[2] >= alpha:
        return None
    i, x, p_value = peak
    j = i + (1 if spec[i + 1] > spec[i] else 0)
    # Present in every block with the same phase, like the thirds of step 4.
    whole = _component(resid, np.arange(n), j, n)
    if abs(whole) == 0:
        return None
    unit = whole / abs(whole)
    bounds = np.cumsum([0] + [len(b) for b in blocks])
    each = [
        _component(resid, np.arange(lo, hi), j, n)
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    if min((c * unit.conjugate()).real for c in each) < _BLOCK_SHARE * abs(whole):
        return None
    noise = float(spec[i] + spec[i + 1]) / x  # the background level per bin
    signal = max(float(spec[i] + spec[i + 1]) - 2.0 * noise, 0.0)
    return {
        "period_steps": n / _peak_bin(spec, j) * stride,
        "amplitude": 2.0 * math.sqrt(signal) / n,
        "p_value": p_value,
        "blocks": float(parts),
    }


def match_data_period(period: float, data_period: float | None) -> tuple[bool | None, int | None]:
    """Whether `period` is the data period or one of its first harmonics (P/2, P/3, P/4)."""
    if not data_period:
        return None, None
    for h in (1, 2, 3, 4):
        if abs(period - data_period / h) <= _MATCH_TOL * data_period / h:
            return True, h
    return False, None


class OscillationDetector:
    code = "R105"

    def __init__(
        self,
        metric: str = "loss",
        window: int = 1024,
        interval: int = 128,
        alpha: float = 1e-6,
        min_amplitude: float = 0.003,
        data_period: float | None = None,
    ) -> None:
        self.metric = metric
        self.window = window
        self.interval = interval
        self.alpha = alpha
        self.min_amplitude = min_amplitude
        self.data_period = data_period
        # Two deques of plain numbers: np.fromiter turns them into arrays ~10x faster than
        # a deque of (step, value) tuples, which matters every `interval` rows.
        self.steps: deque[int] = deque(maxlen=window)
        self.values: deque[float] = deque(maxlen=window)
        self.since_test = 0
        self.rows = 0  # rows seen since the start: blocks end at multiples of `block`
        self.block = window // 2  # rows per block of the faint-wave test
        self.blocks: deque[np.ndarray] = deque(maxlen=BLOCKS)
        # The long-period test's history: the run at a coarse stride (slow_wave.py).
        self.coarse = CoarseHistory(max(window // RESOLUTION, 1))
        self.reported: list[float] = []

    def update(self, step: int, metrics: Mapping[str, float | None]) -> list[Finding]:
        x = metrics.get(self.metric)
        if x is None or not math.isfinite(x):
            return []
        self.steps.append(int(step))
        self.values.append(float(x))
        self.since_test += 1
        self.rows += 1
        self.coarse.add(int(step), float(x))
        found = self._block(step) if self.rows % self.block == 0 else []
        if self.coarse.fresh >= EVERY:
            found += self._slow(step)
        if self.since_test < self.interval or len(self.values) < MIN_ROWS:
            return found
        return found + self._test(step)

    def finalize(self, step: int | None = None) -> list[Finding]:
        """Test the rows seen since the last test (offline: at the end of a log)."""
        if self.since_test == 0 or not self.values:
            return []
        at = self.steps[-1] if step is None else step
        found = self._test(at)
        return found + (self._slow(at) if self.coarse.fresh else [])

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.values)
        steps = np.fromiter(self.steps, dtype=np.float64, count=n)
        return steps, np.fromiter(self.values, dtype=np.float64, count=n)

    def _test(self, step: int) -> list[Finding]:
        self.since_test = 0
        wave = find_wave(*self._arrays(), self.alpha)
        return self._report(step, wave, "periodogram of one window")

    def _block(self, step: int) -> list[Finding]:
        """A block of `window / 2` rows is complete: keep its residual, test the last ones."""
        steps, values = self._arrays()
        steps, values = steps[-self.block :], values[-self.block :]
        resid = detrended(steps, values)
        if resid is None:
            return []
        self.blocks.append(resid)
        stride = max(float(np.median(np.diff(steps))), 1e-12)
        wave = find_long_wave(list(self.blocks), stride, self.alpha)
        if wave is None:
            return []
        return self._report(
            step, wave, f"periodogram of the last {wave['blocks'] * self.block:.0f} rows"
        )

    def _slow(self, step: int) -> list[Finding]:
        """The long-period test over the coarse history (slow_wave.py)."""
        self.coarse.fresh = 0
        steps, values = self.coarse.arrays()
        wave = find_slow_wave(steps, values, self.coarse.stride, self.alpha)
        if wave is None:
            return []
        point_steps = max(float(np.median(np.diff(steps))), 1e-12)
        if is_alias(wave["period_steps"], self.reported, point_steps):
            return []
        return self._report(step, wave, f"long-period test over the last {wave['rows']:.0f} rows")

    def _report(self, step: int, wave: dict[str, float] | None, test: str) -> list[Finding]:
        if wave is None or wave["amplitude"] < self.min_amplitude:
            return []
        period = wave["period_steps"]
        # One finding per distinct wave, not one per test of the same wave.
        if any(abs(period - p) <= 0.15 * p for p in self.reported):
            return []
        self.reported.append(period)
        matches, harmonic = match_data_period(period, self.data_period)
        known = ""
        if matches is not None:
            known = (
                f"; it matches the data period {self.data_period:g}"
                + (f" (harmonic {harmonic})" if harmonic and harmonic > 1 else "")
                if matches
                else f"; it does not match the data period {self.data_period:g}"
            )
        rows = int(wave.get("rows", len(self.values) * wave.get("blocks", 1)))
        # Windows' worth of rows the test covered: blocks joined, or the long test's span.
        windows = int(wave.get("blocks", max(rows // self.window, 1)))
        kind = "long" if "rows" in wave else ("blocks" if "blocks" in wave else "window")
        return [
            Finding.of(
                self.code,
                f"{self.metric} oscillates with a period of {period:.1f} steps and a relative "
                f"amplitude of {wave['amplitude']:.2%} ({test}, p={wave['p_value']:.1e})" + known,
                step=step,
                metric=self.metric,
                data={
                    "period_steps": float(period),
                    "amplitude": float(wave["amplitude"]),
                    "p_value": float(wave["p_value"]),
                    "rows": rows,
                    "windows": windows,
                    "test": kind,
                    "data_period_steps": self.data_period,
                    "matches_data_period": matches,
                    "harmonic": harmonic,
                },
            )
        ]

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": list(self.steps),
            "values": list(self.values),
            "since_test": self.since_test,
            "rows": self.rows,
            "blocks": [b.tolist() for b in self.blocks],
            "coarse": self.coarse.state_dict(),
            "reported": list(self.reported),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps.clear()
        self.values.clear()
        self.steps.extend(int(s) for s in state["steps"])
        self.values.extend(float(v) for v in state["values"])
        self.since_test = int(state["since_test"])
        # States saved before the faint-wave test have no blocks: they start empty.
        self.rows = int(state.get("rows", len(self.values)))
        self.blocks.clear()
        self.blocks.extend(np.asarray(b, dtype=np.float64) for b in state.get("blocks", []))
        # States saved before the long-period test have no coarse history: it starts empty.
        self.coarse.load_state_dict(state.get("coarse", {}))
        self.reported = [float(p) for p in state["reported"]]
