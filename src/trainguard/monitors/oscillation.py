"""R105: a periodic wave in the loss, the signature of a poorly shuffled data order.

Every `interval` rows the last `window` rows are tested:
1. Detrend: fit a degree-5 polynomial in log(step) to log(loss) by least squares (a power law
   with warm-up and a cosine schedule is smooth in those coordinates) and keep the residual.
   Log units make the amplitude relative: 0.01 means a 1% wave.
2. Periodogram of the residual (no taper, so bins are independent under white noise), over
   frequencies k = 5 .. (n-1)//2: periods from n/5 rows down to two rows. Slower waves cannot
   be told apart from the trend the polynomial absorbs (at k = 4 the misfit of a warm-up's fast
   fall passed every test below in about 1 clean curve in 1000).
3. Fisher's g-test: g = max P_k / sum P_k; under white noise P(G > g) ~= m (1 - g)^(m - 1) for m
   bins. A peak is a wave when that is below `alpha` and its amplitude at least `min_amplitude`.
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
   one periodogram, over periods up to a quarter of a block. Its bins are normalised by the
   median bin over ln 2 (each ~ Exp(1) under white noise; the median ignores a few misfit
   lobes and the wave), two adjacent bins are summed so a wave between them keeps its power
   (~ Gamma(2): P(> x) = (1 + x) e^-x), and the largest pair is a wave when that tail times the
   number of pairs and of K tried is below `alpha`, every block carries at least a quarter of
   the wave's amplitude in phase (as step 4: a misfit in one block cannot pass), and the
   amplitude reaches `min_amplitude`. The period is refined by a parabola through the log
   powers around the peak.
The fit and FFT cost O(n log n) every `interval` rows, plus, every window/2 rows, one fit and
at most 7 FFTs of up to 4096 rows for the faint-wave test: a constant amortised cost per step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trainguard.findings import Finding

MIN_ROWS = 96
BLOCKS = 8
"""Completed blocks (half a window each) the faint-wave test joins at most."""
_BLOCK_SHARE = 0.25
_DEGREE = 5
_K_MIN = 4
_K_MIN_BLOCK = 4
_PAD = 8
_THIRDS_MIN = 0.5
_THIRDS_MAX = 1.5
_MATCH_TOL = 0.1


def _component(resid: np.ndarray, idx: np.ndarray, k: int, n: int) -> complex:
    """Complex amplitude of the frequency k/n component of resid restricted to positions idx."""
    phase = 2.0 * np.pi * k * idx / n
    c = float(resid[idx] @ np.cos(phase))
    s = float(resid[idx] @ np.sin(phase))
    return complex(c, s) * 2.0 / len(idx)


def detrended(steps: np.ndarray, values: np.ndarray) -> np.ndarray | None:
    """The residual of log(values) after the trend fit (step 1), or None when there is nothing
    to test (too few rows, a single step, or a curve the polynomial explains exactly)."""
    if len(values) < MIN_ROWS:
        return None
    y = np.log(values) if np.all(values > 0) else values / max(np.mean(np.abs(values)), 1e-12)
    t = np.log1p(np.maximum(steps, 0.0))  # log(step + 1): finite at step 0
    t_lo, t_hi = float(t.min()), float(t.max())
    if t_hi <= t_lo:
        return None
    u = 2.0 * (t - t_lo) / (t_hi - t_lo) - 1.0
    design = np.vander(u, _DEGREE + 1)  # (n, degree + 1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    if not np.any(np.abs(resid) > 1e-9):
        return None  # a curve the polynomial explains exactly: constant, pure power law
    return resid


def find_wave(steps: np.ndarray, values: np.ndarray, alpha: float) -> dict[str, float] | None:
    """The most significant periodic component of `values` over `steps`, or None.

    Returns {"period_steps", "amplitude", "p_value", "g"} when Fisher's test rejects white noise
    at `alpha` and the wave is present throughout; pure function, used online and offline.
    """
    resid = detrended(steps, values)
    if resid is None:
        return None
    n = len(resid)
    spec = np.abs(np.fft.rfft(resid)) ** 2
    band = spec[_K_MIN : (n - 1) // 2 + 1]
    total = float(band.sum())
    if total <= 0 or len(band) < 8:
        return None
    k_rel = int(np.argmax(band))
    g = float(band[k_rel]) / total
    m = len(band)
    p_value = min(1.0, m * (1.0 - g) ** (m - 1))
    if p_value >= alpha:
        return None
    k = k_rel + _K_MIN
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
        "g": g,
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
    band = spec[_K_MIN_BLOCK * parts : (n - 1) // 2 + 1]  # slower than n/parts/4: the trend's
    if len(band) < 8:
        return None
    # The white-noise level per bin: the median bin over ln 2 (the median of Exp(1)), which
    # neither a trend misfit at a few low frequencies nor the wave itself moves much.
    noise = float(np.median(band)) / math.log(2.0)
    if noise <= 0:
        return None
    pairs = (band[:-1] + band[1:]) / noise  # a wave between two bins keeps its power
    i = int(np.argmax(pairs))
    x = float(pairs[i])
    # Each normalised bin ~ Exp(1) under white noise, a pair ~ Gamma(2): P(> x) = (1 + x) e^-x.
    p_value = min(1.0, len(pairs) * (1.0 + x) * math.exp(-x))
    if p_value >= alpha:
        return None
    j = i + _K_MIN_BLOCK * parts + (1 if band[i + 1] > band[i] else 0)
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
    signal = max(float(band[i] + band[i + 1]) - 2.0 * noise, 0.0)
    return {
        "period_steps": n / _peak_bin(spec, j) * stride,
        "amplitude": 2.0 * math.sqrt(signal) / n,
        "p_value": p_value,
        "blocks": float(parts),
    }


def _peak_bin(spectrum: np.ndarray, j: int) -> float:
    """The frequency (in bins) of the peak at bin j, refined by a parabola through the log
    powers of bins j - 1, j, j + 1."""
    if 0 < j < len(spectrum) - 1:
        a, b, c = np.log(np.maximum(spectrum[j - 1 : j + 2], 1e-300))
        denom = a - 2.0 * b + c
        if denom < 0:
            return j + float(np.clip(0.5 * (a - c) / denom, -0.5, 0.5))
    return float(j)


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
        self.reported: list[float] = []

    def update(self, step: int, metrics: Mapping[str, float | None]) -> list[Finding]:
        x = metrics.get(self.metric)
        if x is None or not math.isfinite(x):
            return []
        self.steps.append(int(step))
        self.values.append(float(x))
        self.since_test += 1
        self.rows += 1
        found = self._block(step) if self.rows % self.block == 0 else []
        if self.since_test < self.interval or len(self.values) < MIN_ROWS:
            return found
        return found + self._test(step)

    def finalize(self, step: int | None = None) -> list[Finding]:
        """Test the rows seen since the last test (offline: at the end of a log)."""
        if self.since_test == 0 or not self.values:
            return []
        return self._test(self.steps[-1] if step is None else step)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.values)
        steps = np.fromiter(self.steps, dtype=np.float64, count=n)
        return steps, np.fromiter(self.values, dtype=np.float64, count=n)

    def _test(self, step: int) -> list[Finding]:
        self.since_test = 0
        wave = find_wave(*self._arrays(), self.alpha)
        return self._report(step, wave, "Fisher's g-test")

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
        windows = int(wave.get("blocks", 1))
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
                    "rows": len(self.values) * windows,
                    "windows": windows,
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
        self.reported = [float(p) for p in state["reported"]]
