"""`run_model_checks`: every pre-flight model check, in train and in eval mode.

Per mode, one reference batch x (B, T) of random token ids is shared by the checks:
determinism (same seed twice), batch independence (M103), future-token leak (M101), gradient
leak map (M102), train/serve consistency (M104) and MoE token drops (M105). Rows of x are
independent sequences; when the model is batch-independent, the leak checks test one cut
point per row, so 16 cut points cost B-times fewer passes. The model is left exactly as it
was (modes, parameters, buffers) and the caller's RNG state is untouched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainguard.checks._model_runner import (
    CheckStats,
    ModelCheckInputError,
    ModelRunner,
    ModelState,
    cut_points,
    logit_change,
    position_ranges,
    set_mode,
)
from trainguard.checks.batch_independence import check_batch_independence
from trainguard.checks.causality import check_future_leak
from trainguard.checks.gradient_leak import check_gradient_leak
from trainguard.checks.moe_drops import check_moe_drops
from trainguard.checks.train_serve import check_train_serve
from trainguard.config.schema import Recipe
from trainguard.findings import Finding, has_errors

MODES = ("train", "eval")


@dataclass
class CheckReport:
    """Findings of the model checks plus the cost of each check."""

    findings: list[Finding]
    stats: dict[str, CheckStats]
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
            "checks": {k: v.to_dict() for k, v in self.stats.items()},
            "seconds": self.seconds,
            **self.details,
        }


def _validate(model: Any, vocab_size: int, seq_len: int, batch_size: int) -> None:
    if not isinstance(model, nn.Module):
        raise ModelCheckInputError(
            f"expected a torch.nn.Module, got {type(model).__name__}",
            "make the factory return an nn.Module mapping LongTensor [B, T] to logits",
        )
    if vocab_size < 2:
        raise ModelCheckInputError(
            f"vocab size {vocab_size} is too small", "give --vocab-size >= 2"
        )
    if seq_len < 2:
        raise ModelCheckInputError(
            f"sequence length {seq_len} leaves no later position to test", "give --seq-len >= 2"
        )
    if batch_size < 2:
        raise ModelCheckInputError(
            f"batch size {batch_size} cannot test batch independence", "give --batch-size >= 2"
        )


def check_shadow_args(dtype: str | None, shadow_steps: int) -> None:
    """A shadow run compares low-precision weights with float64: it needs a low dtype (asking
    for one without it used to be accepted and ignored)."""
    if shadow_steps < 0:
        raise ModelCheckInputError(
            f"--shadow-steps {shadow_steps} is negative", "give --shadow-steps 0 or more"
        )
    if shadow_steps > 0 and dtype in (None, "fp32"):
        raise ModelCheckInputError(
            f"--shadow-steps {shadow_steps} needs a low-precision --dtype: the shadow run "
            f"trains with weights in that dtype against float64 (got --dtype {dtype or 'none'})",
            "add --dtype bf16 (or fp16), or drop --shadow-steps",
        )


def check_finite_logits(logits: torch.Tensor, mode: str) -> list[Finding]:
    """M108 when the reference forward's logits hold NaN or infinity."""
    bad = ~torch.isfinite(logits.detach())
    n_bad = int(bad.sum())  # deliberate host sync
    if not n_bad:
        return []
    per_position = bad.any(dim=-1)  # (B, T)
    positions = sorted({int(t) for t in per_position.nonzero()[:, 1].tolist()})
    n_nan = int(torch.isnan(logits.detach()).sum())
    return [
        Finding.of(
            "M108",
            f"non-finite logits in {mode} mode: {n_bad} of {logits.numel()} logits are NaN or "
            f"infinite ({n_nan} NaN) at {len(positions)} of {logits.shape[1]} positions "
            f"({position_ranges(positions)}); the leak checks compared the finite entries only",
            where=f"{mode} mode",
            data={
                "mode": mode,
                "non_finite": n_bad,
                "nan": n_nan,
                "total": logits.numel(),
                "positions": position_ranges(positions),
            },
        )
    ]


def _check_mode(runner: ModelRunner, mode: str, n_cuts: int, batch_cuts: bool) -> list[Finding]:
    findings: list[Finding] = []
    set_mode(runner.model, mode)
    b, t = runner.batch_size, runner.seq_len
    x = runner.tokens(b, t)
    with runner.timed("reference") as stats:
        base, _ = runner.forward(x, stats)
        again, _ = runner.forward(x, stats)
        base, again = base.detach(), again.detach()
        # Finite entries only: with a NaN the tolerance would be NaN and every check would pass.
        noise = float(logit_change(base, again).max())  # deliberate host sync
    findings += check_finite_logits(base, mode)
    tol = 8.0 * noise
    if noise > 0:
        findings.append(
            Finding.of(
                "M106",
                f"nondeterministic forward in {mode} mode: the same batch and seed gave logits "
                f"differing by up to {noise:.3g}; comparisons allow {tol:.3g}",
                where=f"{mode} mode",
                data={"mode": mode, "noise": noise},
            )
        )
    dependent = check_batch_independence(runner, x, base, mode, tol)
    findings += dependent
    cuts = cut_points(t, n_cuts)
    rows_independent = batch_cuts and not dependent
    findings += check_future_leak(runner, x, base, mode, cuts, rows_independent, tol)
    findings += check_gradient_leak(runner, x, mode, cuts, rows_independent, tol)
    stochastic = False
    if mode == "train":
        with runner.timed("train_serve") as stats:
            other, _ = runner.forward(x, stats, seed=runner.seed + 1)
            stochastic = bool(logit_change(other, base).max() > tol)
    if stochastic:
        findings.append(
            Finding.of(
                "M107",
                "train/serve consistency not checked in train mode: the forward is stochastic "
                "(dropout), so draws cannot line up between different lengths; checked in eval "
                "mode",
                where=f"{mode} mode",
                data={"mode": mode, "check": "train_serve"},
            )
        )
    else:
        findings += check_train_serve(runner, x, base, mode, atol=tol)
    drops, per_layer = check_moe_drops(runner, mode)
    findings += drops
    if per_layer:
        runner.moe_drops[mode] = per_layer
    return findings


def run_model_checks(
    model: nn.Module,
    vocab_size: int,
    seq_len: int,
    batch_size: int = 4,
    dtype: str | None = None,
    seed: int = 0,
    n_cuts: int = 16,
    modes: tuple[str, ...] = MODES,
    lr: float = 3e-3,
    min_lr: float | None = None,
    master_weights: str = "fp32",
    shadow_steps: int = 0,
    batch_cuts: bool = True,
) -> CheckReport:
    """Run every model check on `model` (LongTensor [B, T] -> logits [B, T, V]).

    `dtype` ("fp32", "bf16", "fp16") adds the model-level precision audit
    (`precision_audit.audit_model_precision`) at learning rates `lr` and `min_lr`, with the
    weights kept in `master_weights`, plus a shadow run of `shadow_steps` steps if > 0.
    `batch_cuts` tests one cut point per batch row when the model is batch-independent
    (B times fewer passes); False always shares one cut across the batch (the slower
    fallback used for batch-dependent models). Raises `ModelCheckInputError` (exit 2) when
    the model cannot be run as described.
    """
    _validate(model, vocab_size, seq_len, batch_size)
    check_shadow_args(dtype, shadow_steps)
    t0 = time.perf_counter()
    runner = ModelRunner(model, vocab_size, seq_len, batch_size, seed)
    state = ModelState(model)
    findings: list[Finding] = []
    details: dict[str, Any] = {"modes": list(modes), "cut_points": cut_points(seq_len, n_cuts)}
    try:
        for mode in modes:
            findings += _check_mode(runner, mode, n_cuts, batch_cuts)
    finally:
        state.restore()
    if runner.moe_drops:
        details["moe_drops"] = runner.moe_drops
    if dtype is not None:
        from trainguard.checks.precision_audit import audit_model_precision

        with runner.timed("precision_audit") as stats:
            audit = audit_model_precision(
                model,
                vocab_size,
                seq_len,
                dtype,
                lr=lr,
                min_lr=min_lr,
                batch_size=batch_size,
                seed=seed,
                master_weights=master_weights,
                shadow_steps=shadow_steps,
            )
            stats.forwards += audit.forwards
            stats.backwards += audit.backwards
        findings += audit.findings
        details["precision"] = audit.details
    return CheckReport(findings, runner.stats, time.perf_counter() - t0, details)


def check_target(
    target: str | None,
    hf: str | None = None,
    *,
    vocab_size: int | None = None,
    seq_len: int = 128,
    batch_size: int = 4,
    dtype: str | None = None,
    lr: float = 3e-3,
    master_weights: str = "fp32",
    shadow_steps: int = 0,
    seed: int = 0,
) -> tuple[CheckReport, str, int]:
    """`trainguard check-model`: (report, the model's label, the vocabulary size used) for a
    model factory `target` ("file.py:factory" or "module:factory") or a Hugging Face config
    `hf`. The dtypes and shadow settings are bad input (exit 2) before the model is built; the
    vocabulary comes from the first nn.Embedding unless `vocab_size` is given."""
    from trainguard.checks.hf_model import load_target
    from trainguard.checks.model_target import infer_vocab_size
    from trainguard.numerics.reduction import dtype_of

    if dtype is not None:
        dtype_of(dtype)
    dtype_of(master_weights)
    check_shadow_args(dtype, shadow_steps)
    model, label = load_target(target, hf, seed)
    vocab = vocab_size or infer_vocab_size(model)
    if vocab is None:
        raise ModelCheckInputError(
            "cannot infer the vocabulary size: the model has no nn.Embedding",
            "give --vocab-size V",
        )
    report = run_model_checks(
        model,
        vocab,
        seq_len,
        batch_size=batch_size,
        dtype=dtype,
        seed=seed,
        lr=lr,
        master_weights=master_weights,
        shadow_steps=shadow_steps,
    )
    return report, label, vocab


def run_recipe_checks(
    model: nn.Module, recipe: Recipe, vocab_size: int, batch_size: int = 4
) -> CheckReport:
    """Pre-flight: the model checks on the recipe's model at its sequence length and seed,
    plus the precision audit when `train.precision` is not fp32 (autocast with fp32 weights,
    so update swallowing is reported as a what-if), at the schedule's peak and final rates."""
    train = recipe.train
    return run_model_checks(
        model,
        vocab_size,
        recipe.data.seq_len,
        batch_size=batch_size,
        dtype=None if train.precision == "fp32" else train.precision,
        seed=train.seed,
        lr=train.lr,
        min_lr=train.lr * train.min_lr_ratio,
        master_weights="fp32",
    )
