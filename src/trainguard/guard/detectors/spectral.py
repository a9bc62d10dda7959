"""The arithmetic R105's tests share: the trend fit, a component at one frequency, a peak's
position between bins. Pure numpy functions of arrays; the tests are in oscillation.py (one
window, joined blocks) and slow_wave.py (the whole run at a coarse stride)."""

from __future__ import annotations

import numpy as np

MIN_ROWS = 96
"""Fewest rows (or coarse points) a trend is fitted to."""
DEGREE = 5
"""Degree of the trend polynomial in log(step + 1)."""
MIN_SIDE = 4
"""Fewest bins on each side of a pair that give its noise level (local_peak)."""


def trend_design(steps: np.ndarray) -> np.ndarray | None:
    """(n, DEGREE + 1) columns of the trend: powers of log(step + 1) scaled to [-1, 1], or None
    when every row has the same step (nothing to fit against)."""
    t = np.log1p(np.maximum(steps, 0.0))  # log(step + 1): finite at step 0
    t_lo, t_hi = float(t.min()), float(t.max())
    if t_hi <= t_lo:
        return None
    u = 2.0 * (t - t_lo) / (t_hi - t_lo) - 1.0
    return np.vander(u, DEGREE + 1)


def relative(values: np.ndarray) -> np.ndarray:
    """log(values) when all are positive (a wave's amplitude is then relative: 0.01 is 1%),
    else values over their mean magnitude."""
    if np.all(values > 0):
        return np.log(values)
    return values / max(float(np.mean(np.abs(values))), 1e-12)


def trend_fit(
    steps: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(y, design, residual): the curve in relative units, the trend's columns and y less its
    least-squares trend; None when there is nothing to test (too few rows, a single step, or a
    curve the polynomial explains exactly)."""
    if len(values) < MIN_ROWS:
        return None
    design = trend_design(steps)
    if design is None:
        return None
    y = relative(values)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    if not np.any(np.abs(resid) > 1e-9):
        return None  # a curve the polynomial explains exactly: constant, pure power law
    return y, design, resid


def detrended(steps: np.ndarray, values: np.ndarray) -> np.ndarray | None:
    """The residual of `trend_fit`, or None."""
    fit = trend_fit(steps, values)
    return None if fit is None else fit[2]


def component(resid: np.ndarray, idx: np.ndarray, k: float, n: int) -> complex:
    """Complex amplitude of the frequency k/n component of resid restricted to positions idx."""
    phase = 2.0 * np.pi * k * idx / n
    c = float(resid[idx] @ np.cos(phase))
    s = float(resid[idx] @ np.sin(phase))
    return complex(c, s) * 2.0 / len(idx)


def peak_bin(spectrum: np.ndarray, j: int) -> float:
    """The frequency (in bins) of the peak at bin j, refined by a parabola through the log
    powers of bins j - 1, j, j + 1."""
    if 0 < j < len(spectrum) - 1:
        a, b, c = np.log(np.maximum(spectrum[j - 1 : j + 2], 1e-300))
        denom = a - 2.0 * b + c
        if denom < 0:
            return j + float(np.clip(0.5 * (a - c) / denom, -0.5, 0.5))
    return float(j)


def pair_tail(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """P(pair / (background / m) > x) under white noise: a Gamma(2) (two bins) over the mean of
    m Exp(1) bins (the background), all in one unit: (1 + s)^-(m + 1) (1 + s + m s), s = x / m
    (E[(1 + s Z) e^(-s Z)] for Z ~ Gamma(m))."""
    s = x / m
    return np.exp(-(m + 1.0) * np.log1p(s)) * (1.0 + s + m * s)


def local_peak(
    spec: np.ndarray, k_lo: int, k_hi: int, top: int, side: int, centred: bool = True
) -> tuple[int, float, float] | None:
    """The most significant pair of adjacent bins (k, k + 1), k_lo <= k < k_hi, against its own
    neighbourhood: the mean of the bins within `side` of it, the four bins k - 1 .. k + 2 left out
    (the wave's leakage). Returns (k, x, p): x the pair over the background mean, p the chance of
    so large an x anywhere under noise that is white near each pair (Bonferroni over the pairs);
    None when there are too few bins.

    A local level, not one for the whole band, because batch noise is not white: AR(1)-correlated
    noise and the trend's misfit tilt the spectrum by a factor of several across the band, and a
    wave is a peak over its own neighbourhood, which a tilt is not. `centred`: the neighbourhood
    is as wide below the pair as above it and stays within [k_lo, top] (pairs with fewer than
    MIN_SIDE bins on a side are not tested), so that on a convex spectrum (an AR(1)'s red slope)
    its mean lies above the pair's own level: conservative. A one-sided neighbourhood at the band's
    low edge, or one reaching below k_lo where the trend fit has removed power, sits below it on a
    red slope: at 10,000 steps under AR(1) 0.9 noise that raised R105 on 3 of 100 clean curves.
    Not centred (the long-period test, whose coarse noise is flat well past its band), the window
    is clipped to [1, top] instead."""
    ks = np.arange(k_lo, min(k_hi, top - 1))  # k + 2 <= top: the left-out bins exist
    if centred:
        ks = ks[np.minimum(ks - 1 - k_lo, top - ks - 2) >= MIN_SIDE]
    if len(ks) < 8:
        return None
    if centred:
        half = np.minimum(np.minimum(ks - 1 - k_lo, top - ks - 2), side)
        lo, hi = ks - 1 - half, ks + 2 + half
    else:
        lo, hi = np.maximum(ks - 1 - side, 1), np.minimum(ks + 2 + side, top)  # inclusive
    csum = np.concatenate(([0.0], np.cumsum(spec)))
    m = (hi - lo + 1 - 4).astype(np.float64)
    background = csum[hi + 1] - csum[lo] - (csum[ks + 3] - csum[ks - 1])
    if np.any(m < 2 * MIN_SIDE) or np.any(background <= 0):
        return None
    x = (spec[ks] + spec[ks + 1]) / (background / m)
    tails = pair_tail(x, m)
    i = int(np.argmin(tails))
    return int(ks[i]), float(x[i]), min(1.0, float(tails[i]) * len(ks))
