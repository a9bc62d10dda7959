"""R105: a periodic wave in the loss, the signature of a poorly shuffled data order.

Every `interval` rows the last `window` rows are tested:
1. Detrend: fit a degree-5 polynomial in log(step) to log(loss) by least squares (a power law
   with warm-up and a cosine schedule is smooth in those coordinates) and keep the residual.
   Log units make the amplitude relative: 0.01 means a 1% wave.
2. Periodogram of the residual (no taper, so bins are independent under white noise), over
   frequencies k = 4 .. (n-1)//2: periods from n/4 rows down to two rows. Slower waves cannot
   be told apart from the trend the polynomial absorbs.
3. Fisher's g-test: g = max P_k / sum P_k; under white noise P(G > g) ~= m (1 - g)^(m - 1) for m
   bins. A peak is a wave when that is below `alpha` and its amplitude at least `min_amplitude`.
4. Stationarity: a wave from the data order persists with a fixed period and phase, so the
   component, measured in each third of the window against the whole window's phase, must
   keep at least half its amplitude there. Trend misfit (the fast fall after warm-up, the
   bend where a divergence starts) is lobes of changing size and sign, and fails this even
   when the residual has no noise at all.
5. The period is refined on an 8x zero-padded, Hann-tapered spectrum, converted from rows to
   steps (rows may be logged every k steps), and compared with the known data period P: it
   matches when it is within 10% of P / h for a harmonic h in 1..4.
The fit and FFT cost O(n log n) every `interval` rows, a constant amortised cost per step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainguard.findings import Finding

MIN_ROWS = 96
_DEGREE = 5
_K_MIN = 4
_PAD = 8
_THIRDS_MIN = 0.5
_MATCH_TOL = 0.1


def _component(resid: np.ndarray, idx: np.ndarray, k: int, n: int) -> complex:
    """Complex amplitude of the frequency k/n component of resid restricted to positions idx."""
    phase = 2.0 * np.pi * k * idx / n
    c = float(resid[idx] @ np.cos(phase))
    s = float(resid[idx] @ np.sin(phase))
    return complex(c, s) * 2.0 / len(idx)


def find_wave(steps: np.ndarray, values: np.ndarray, alpha: float) -> dict[str, float] | None:
    """The most significant periodic component of `values` over `steps`, or None.

    Returns {"period_steps", "amplitude", "p_value", "g"} when Fisher's test rejects white noise
    at `alpha` and the wave is present throughout; pure function, used online and offline.
    """
    n = len(values)
    if n < MIN_ROWS:
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
    if min((t * unit.conjugate()).real for t in thirds) < _THIRDS_MIN * abs(whole):
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
        self.interval = interval
        self.alpha = alpha
        self.min_amplitude = min_amplitude
        self.data_period = data_period
        # Two deques of plain numbers: np.fromiter turns them into arrays ~10x faster than
        # a deque of (step, value) tuples, which matters every `interval` rows.
        self.steps: deque[int] = deque(maxlen=window)
        self.values: deque[float] = deque(maxlen=window)
        self.since_test = 0
        self.reported: list[float] = []

    def update(self, step: int, metrics: Mapping[str, float | None]) -> list[Finding]:
        x = metrics.get(self.metric)
        if x is None or not math.isfinite(x):
            return []
        self.steps.append(int(step))
        self.values.append(float(x))
        self.since_test += 1
        if self.since_test < self.interval or len(self.values) < MIN_ROWS:
            return []
        return self._test(step)

    def finalize(self, step: int | None = None) -> list[Finding]:
        """Test the rows seen since the last test (offline: at the end of a log)."""
        if self.since_test == 0 or not self.values:
            return []
        return self._test(self.steps[-1] if step is None else step)

    def _test(self, step: int) -> list[Finding]:
        self.since_test = 0
        n = len(self.values)
        steps = np.fromiter(self.steps, dtype=np.float64, count=n)
        values = np.fromiter(self.values, dtype=np.float64, count=n)
        wave = find_wave(steps, values, self.alpha)
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
        return [
            Finding.of(
                self.code,
                f"{self.metric} oscillates with a period of {period:.1f} steps and a relative "
                f"amplitude of {wave['amplitude']:.2%} (Fisher's g-test p={wave['p_value']:.1e})"
                + known,
                step=step,
                metric=self.metric,
                data={
                    "period_steps": float(period),
                    "amplitude": float(wave["amplitude"]),
                    "p_value": float(wave["p_value"]),
                    "rows": len(self.values),
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
            "reported": list(self.reported),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps.clear()
        self.values.clear()
        self.steps.extend(int(s) for s in state["steps"])
        self.values.extend(float(v) for v in state["values"])
        self.since_test = int(state["since_test"])
        self.reported = [float(p) for p in state["reported"]]
