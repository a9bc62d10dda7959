"""Synthetic training curves with planted faults, for tests, benchmarks and drills.

A clean loss curve is a power law in the step with a floor, an optional linear warm-up from a
high initial loss, a cosine learning-rate schedule's extra decay, and multiplicative per-batch
noise (Gaussian, or Student-t for the heavy tails of real batch losses). Faults are planted on
top: a spike, a non-finite value, a divergence ramp, a sinusoidal wave, a throughput drop.
"""

from __future__ import annotations

import numpy as np


def clean_loss(
    n: int,
    seed: int = 0,
    noise: float = 0.02,
    heavy_tails: bool = False,
    warmup: int = 0,
    floor: float = 2.0,
    scale: float = 8.0,
    exponent: float = 0.5,
    cosine: bool = False,
) -> np.ndarray:
    """(n,) positive losses: floor + scale * (step + 1) ** -exponent, times (1 + noise)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=np.float64)
    loss = floor + scale * (t + 1.0) ** -exponent
    if warmup:
        # Early on the model is near its initial loss (log vocab); it falls as the LR warms up.
        start = floor + scale * 1.2
        w = np.clip(t / warmup, 0.0, 1.0)
        loss = np.where(t < warmup, start + (loss - start) * w, loss)
    if cosine:
        # The LR decay lowers the loss further towards the end of the schedule.
        loss = loss - 0.05 * floor * (1 - np.cos(np.pi * t / max(n - 1, 1))) / 2
    if heavy_tails:
        eps = rng.standard_t(df=4, size=n) * noise / np.sqrt(2.0)  # same variance as normal
    else:
        eps = rng.normal(0.0, noise, size=n)
    return loss * (1.0 + eps)


def clean_grad_norm(n: int, seed: int = 1, noise: float = 0.1) -> np.ndarray:
    """(n,) gradient norms: high early, settling to a plateau, with log-normal noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=np.float64)
    base = 0.5 + 2.0 * np.exp(-t / 100.0)
    return base * np.exp(rng.normal(0.0, noise, size=n))


def clean_throughput(n: int, seed: int = 2, level: float = 50_000.0) -> np.ndarray:
    """(n,) tokens/s with 3% noise, slow first steps and an occasional slow (checkpoint) step."""
    rng = np.random.default_rng(seed)
    tps = level * (1.0 + rng.normal(0.0, 0.03, size=n))
    tps[:3] *= 0.3
    tps[100::100] *= 0.5
    return tps


def plant_wave(loss: np.ndarray, period: float, amplitude: float = 0.02, start: int = 0):
    """Multiply in a relative sinusoid of `period` steps from `start` on."""
    t = np.arange(len(loss), dtype=np.float64)
    wave = 1.0 + amplitude * np.sin(2 * np.pi * t / period)
    out = loss.copy()
    out[start:] *= wave[start:]
    return out


def plant_divergence(loss: np.ndarray, start: int, rate: float = 0.004) -> np.ndarray:
    """From `start` on, the loss grows by `rate` per step (relative, compounding)."""
    out = loss.copy()
    k = np.arange(len(loss) - start, dtype=np.float64)
    out[start:] *= (1.0 + rate) ** k
    return out
