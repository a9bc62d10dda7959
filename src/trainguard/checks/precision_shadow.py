"""Bias or variance (N107): shadow runs of a small built-in model against float64.

The same K SGD steps with weights stored in the candidate dtype, once rounding to nearest
(what storing bf16 weights does) and once stochastically (the unbiased remedy), each against
float64 from the same start. The growth exponent tells a compounding bias (about 1) from noise
(about 0.5); the stochastic run is the control that shows the difference is the rounding's.
"""

from __future__ import annotations

import torch
from torch import nn

from trainguard.checks.precision_audit import GROWTH_WARN
from trainguard.findings import Finding
from trainguard.numerics.shadow import pattern_batches, shadow_run


def tiny_lm(vocab_size: int = 64, d_model: int = 32, seed: int = 0) -> nn.Module:
    """A small per-position language model (embedding, MLP, head) for the shadow run."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Embedding(vocab_size, d_model),
        nn.Linear(d_model, 4 * d_model),
        nn.GELU(),
        nn.Linear(4 * d_model, vocab_size),
    )


def check_shadow(
    dtype: str, steps: int = 32, lr: float = 1e-3, seed: int = 0
) -> tuple[list[Finding], dict[str, dict]]:
    """N107 (warning) when rounding to nearest makes the error grow with exponent >= 0.75."""
    with torch.random.fork_rng(devices=[]):
        model = tiny_lm(seed=seed)
    batches = pattern_batches(64, 16, 4, steps, seed)
    results = {
        rounding: shadow_run(model, batches, dtype, lr, rounding, seed=seed).to_dict()
        for rounding in ("nearest", "stochastic")
    }
    p, p_sr = results["nearest"]["exponent"], results["stochastic"]["exponent"]
    kind = "a bias that compounds" if p >= GROWTH_WARN else "noise that averages out"
    finding = Finding.of(
        "N107",
        f"{dtype} weights, {steps} SGD steps at lr {lr:g} against float64: the error grows "
        f"like steps^{p:.2f} with rounding to nearest ({kind}); with stochastic rounding "
        f"steps^{p_sr:.2f}",
        severity="warning" if p >= GROWTH_WARN else "info",
        data={"exponent_nearest": p, "exponent_stochastic": p_sr, "steps": steps, "lr": lr},
    )
    return [finding], results
