"""Synthetic training curves with planted faults, for tests, benchmarks and drills.

A clean loss curve is a power law in the step with a floor, an optional linear warm-up from a
high initial loss, a cosine learning-rate schedule's extra decay, and multiplicative per-batch
noise (Gaussian, or Student-t for the heavy tails of real batch losses). Faults are planted on
top: a spike, a non-finite value, a divergence ramp, a sinusoidal wave, a throughput drop.
"""

from __future__ import annotations

import numpy as np


def lr_schedule(n: int, warmup: int = 0, cosine: bool = False, min_ratio: float = 0.1):
    """(n,) learning rates relative to the peak: linear warm-up, then constant or cosine decay."""
    t = np.arange(n, dtype=np.float64)
    lr = np.ones(n)
    if warmup:
        lr = np.minimum(lr, (t + 1.0) / warmup)
    if cosine:
        prog = np.clip((t - warmup) / max(n - warmup - 1, 1), 0.0, 1.0)
        decay = min_ratio + (1 - min_ratio) * 0.5 * (1 + np.cos(np.pi * prog))
        lr = np.where(t < warmup, lr, decay)
    return lr


def clean_loss(
    n: int,
    seed: int = 0,
    noise: float = 0.02,
    heavy_tails: bool = False,
    warmup: int = 0,
    cosine: bool = False,
    floor: float = 2.0,
    scale: float = 8.0,
    exponent: float = 0.5,
    ar1: float = 0.0,
    hetero: bool = False,
) -> np.ndarray:
    """(n,) positive losses with multiplicative per-batch noise of relative std `noise`.

    Batch noise is not always white and steady: `ar1` in [0, 1) correlates consecutive batches'
    noise (an AR(1) process with the same marginal std: neighbouring batches share documents or
    sources), and `hetero` makes its std follow the loss's fall, from 2x `noise` where the curve
    is highest to 0.5x at its lowest (early batches disagree more). Both default off, and with
    them off the curve is the same as before they existed (same draws).

    The noiseless curve is a power law in the *cumulative* learning rate S(t) (the area under
    the schedule), floor + scale * (1 + S) ** -exponent, which is how losses respond to warm-up
    and decay (Tissue et al. 2024, Scaling Law with Learning Rate Annealing): flat while the LR
    is tiny, then falling, with an extra drop while the LR anneals.
    """
    rng = np.random.default_rng(seed)
    lr = lr_schedule(n, warmup, cosine)
    area = np.cumsum(lr)
    loss = floor + scale * (1.0 + area) ** -exponent
    if cosine:
        # Annealing bonus: the loss drops further as the LR decays (the S2 term of Tissue et al.)
        loss = loss - 0.02 * floor * (1.0 - lr)
    if heavy_tails:
        df = 5
        eps = rng.standard_t(df=df, size=n) * noise / np.sqrt(df / (df - 2))  # std = noise
    else:
        eps = rng.normal(0.0, noise, size=n)
    if ar1:
        innovation = np.sqrt(1.0 - ar1 * ar1)
        for i in range(1, n):  # x_t = a x_(t-1) + sqrt(1 - a^2) e_t keeps the std of e
            eps[i] = ar1 * eps[i - 1] + innovation * eps[i]
    if hetero:
        span = max(float(loss.max() - loss.min()), 1e-12)
        eps = eps * (0.5 + 1.5 * (loss - loss.min()) / span)
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
