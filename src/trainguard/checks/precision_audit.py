"""Model-level precision audit: what bf16/fp16 does to this model's gradients and updates.

`audit_model_precision(model, vocab_size, seq_len, dtype, lr=...)` runs one fp32 and one
autocast forward/backward on the same batch (eval mode, so no dropout), and reports:
- N103: per-parameter relative gradient error of autocast against fp32 above 0.1;
- N104/N105 (fp16): activations or gradients beyond fp16's range, gradients below its
  smallest subnormal;
- N106: the fraction of an Adam step's updates (magnitude ~ lr) that rounding erases when the
  weights are stored in the low-precision dtype, at `lr` and at the final `min_lr`;
- N107 (when `shadow_steps` > 0): the growth exponent of a shadow run against float64.
Gradients are taken with `torch.autograd.grad`, so `param.grad` is untouched; modes and
buffers are restored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainguard.checks._model_runner import ModelState
from trainguard.findings import Finding
from trainguard.numerics.logits import extract_logits
from trainguard.numerics.reduction import dtype_of
from trainguard.numerics.shadow import pattern_batches, shadow_run

GRAD_ERROR_WARN = 0.1
FP16_MAX = 65504.0
FP16_TINY = 2.0**-24  # smallest fp16 subnormal: anything smaller flushes to zero
UNDERFLOW_WARN = 0.01
SWALLOW_WARN = 0.01
GROWTH_WARN = 0.75  # midway between noise (0.5) and a compounding bias (1.0)


@dataclass
class PrecisionAudit:
    findings: list[Finding]
    details: dict[str, Any] = field(default_factory=dict)
    forwards: int = 0
    backwards: int = 0


def _loss_and_grads(
    model: nn.Module, batch: torch.Tensor, autocast: torch.dtype | None, amax: dict | None
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    params = [p for p in model.parameters() if p.requires_grad]
    handles = []
    if amax is not None:

        def record(module: nn.Module, inputs: tuple, output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.is_floating_point():
                name = names[module]
                amax[name] = max(amax.get(name, 0.0), float(output.detach().abs().max()))

        names = {m: n or "(root)" for n, m in model.named_modules()}
        handles = [m.register_forward_hook(record) for m in model.modules()]
    device = batch.device.type
    try:
        with torch.autocast(device, dtype=autocast or torch.float32, enabled=autocast is not None):
            logits = extract_logits(model(batch[:, :-1]))
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
    finally:
        for h in handles:
            h.remove()
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return loss.detach(), list(grads)


def _swallowed(model: nn.Module, grads: list, low: torch.dtype, lr: float) -> float:
    """Fraction of nonzero Adam-like updates (lr * sign(g), Adam's first step) that leave a
    weight stored in `low` unchanged after rounding to nearest."""
    hit = total = 0
    params = [p for p in model.parameters() if p.requires_grad]
    for p, g in zip(params, grads, strict=True):
        if g is None:
            continue
        w = p.detach().to(low)
        u = lr * torch.sign(g.detach().float())
        moving = u != 0
        same = (w.float() - u).to(low) == w
        hit += int((same & moving).sum())
        total += int(moving.sum())
    return hit / total if total else 0.0


def audit_model_precision(
    model: nn.Module,
    vocab_size: int,
    seq_len: int,
    dtype: str,
    lr: float = 3e-3,
    min_lr: float | None = None,
    batch_size: int = 4,
    seed: int = 0,
    master_weights: str = "fp32",
    shadow_steps: int = 0,
) -> PrecisionAudit:
    """Findings N103-N107 for training `model` in `dtype` (see the module docstring)."""
    low = dtype_of(dtype)
    dtype_of(master_weights)
    state = ModelState(model)
    device = next(iter(model.parameters())).device
    gen = torch.Generator().manual_seed(seed)
    batch = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=gen).to(device)
    findings: list[Finding] = []
    details: dict[str, Any] = {"dtype": dtype, "master_weights": master_weights}
    audit = PrecisionAudit(findings, details)
    amax: dict[str, float] = {}
    try:
        model.eval()
        loss32, g32 = _loss_and_grads(model, batch, None, amax)
        audit.forwards, audit.backwards = 1, 1
        if low != torch.float32:
            loss_lp, g_lp = _loss_and_grads(model, batch, low, None)
            audit.forwards, audit.backwards = 2, 2
            details["loss_fp32"], details["loss_low"] = float(loss32), float(loss_lp)
            _grad_error(model, g32, g_lp, findings, details, dtype)
        if low == torch.float16:
            _fp16_range(amax, g32, findings, details)
        if low != torch.float32:
            _update_swallowing(model, g32, low, lr, min_lr, master_weights, findings, details)
    finally:
        state.restore()
    if shadow_steps > 0 and low != torch.float32:
        batches = pattern_batches(vocab_size, seq_len, batch_size, shadow_steps, seed)
        res = shadow_run(model, [b.to(device) for b in batches], dtype, lr, "nearest", seed=seed)
        audit.forwards += 2 * shadow_steps
        audit.backwards += 2 * shadow_steps
        details["shadow"] = res.to_dict()
        low_weights = master_weights != "fp32"
        severity = "warning" if res.exponent >= GROWTH_WARN and low_weights else "info"
        kind = "bias that compounds" if res.exponent >= GROWTH_WARN else "noise"
        findings.append(
            Finding.of(
                "N107",
                f"shadow run of {shadow_steps} SGD steps with {dtype} weights against float64: "
                f"||theta - theta_ref|| grows like steps^{res.exponent:.2f} ({kind}); "
                f"relative distance at the end {res.relative_final:.2g}",
                severity=severity,
                data={"exponent": res.exponent, "distances": res.distances},
            )
        )
    return audit


def _grad_error(model, g32, g_lp, findings, details, dtype) -> None:
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    errors = {}
    for name, a, b in zip(names, g32, g_lp, strict=True):
        if a is None or b is None:
            continue
        ref = float(a.double().norm())
        if ref < 1e-12:
            continue
        errors[name] = float((b.double() - a.double()).norm()) / ref
    details["grad_relative_error"] = errors
    bad = {n: e for n, e in errors.items() if not e <= GRAD_ERROR_WARN}  # NaN counts as bad
    if bad:
        worst = sorted(bad.items(), key=lambda kv: -kv[1] if kv[1] == kv[1] else float("-inf"))
        findings.append(
            Finding.of(
                "N103",
                f"{dtype} autocast gradients differ from fp32 by more than "
                f"{GRAD_ERROR_WARN:.0%} (relative norm) for {len(bad)} of {len(errors)} "
                f"parameters; worst: " + ", ".join(f"{n} {e:.2g}" for n, e in worst[:3]),
                data={"parameters": bad, "limit": GRAD_ERROR_WARN},
            )
        )


def _fp16_range(amax, g32, findings, details) -> None:
    gmax = max((float(g.abs().max()) for g in g32 if g is not None), default=0.0)
    over = {n: a for n, a in amax.items() if a > FP16_MAX}
    details["activation_absmax"] = max(amax.values(), default=0.0)
    details["grad_absmax"] = gmax
    if over or gmax > FP16_MAX:
        findings.append(
            Finding.of(
                "N104",
                f"fp16 overflow: {len(over)} module output(s) exceed {FP16_MAX:g} "
                f"(largest {max(over.values(), default=0.0):.3g}); largest gradient {gmax:.3g}",
                data={"modules": over, "grad_absmax": gmax},
            )
        )
    nonzero = tiny = 0
    for g in g32:
        if g is None:
            continue
        a = g.abs()
        nonzero += int((a > 0).sum())
        tiny += int(((a > 0) & (a < FP16_TINY)).sum())
    frac = tiny / nonzero if nonzero else 0.0
    details["grad_underflow_fraction"] = frac
    if frac > UNDERFLOW_WARN:
        findings.append(
            Finding.of(
                "N105",
                f"fp16 underflow: {frac:.1%} of the nonzero gradient entries are below 2^-24 "
                "and would flush to zero without loss scaling",
                data={"fraction": frac, "limit": UNDERFLOW_WARN},
            )
        )


def _update_swallowing(model, g32, low, lr, min_lr, master_weights, findings, details) -> None:
    rates = {"lr": lr} if min_lr is None else {"lr": lr, "min_lr": min_lr}
    fractions = {k: _swallowed(model, g32, low, v) for k, v in rates.items()}
    details["update_swallowed_fraction"] = fractions
    worst = max(fractions, key=fractions.get)
    if fractions[worst] <= SWALLOW_WARN:
        return
    low_weights = master_weights != "fp32"
    what = "are" if low_weights else "would be, if the weights were stored in low precision,"
    findings.append(
        Finding.of(
            "N106",
            f"{fractions[worst]:.1%} of the parameter updates at {worst}={rates[worst]:g} {what} "
            f"erased by rounding the weights to {str(low).removeprefix('torch.')}",
            severity="warning" if low_weights else "info",
            data={"fractions": fractions, "rates": rates, "master_weights": master_weights},
        )
    )
