"""R101 and R107 on a loss logged as exactly 0.0: what a foreign log writes for a step it hid.

The Hugging Face Trainer (transformers 4.x and 5.x, `Trainer._inner_training_loop`) never logs
a non-finite training loss: with `logging_nan_inf_filter` (on by default) a NaN or Inf
micro-batch loss adds `tr_loss / (1 + steps since the last log)` instead, which is 0.0 on the
first step after a log. With `logging_steps=1` every non-finite step is logged as `loss: 0.0`,
beside `grad_norm: NaN` (the gradients of a NaN loss are NaN); a `GuardedTrainer` step skipped
for it logs `grad_norm: 0.0` (its gradients were dropped before clipping). `watch` reads such a
row as:
- R101 (non-finite step) when the gradient norm beside it is NaN or Inf, or, in a
  `trainer_state.json` (`hf_filtered`), absent: the loss was non-finite and the Trainer's
  filter wrote 0.0 in its place;
- R107 (warning) otherwise: a language model's loss is not exactly zero.

Only `watch` runs this: a loop guarded by trainguard sees the loss itself, not a log of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from trainguard.findings import Finding

_FILTER = "the Hugging Face Trainer writes a NaN or Inf loss as 0.0 (logging_nan_inf_filter)"


class ZeroLossDetector:
    """Fires on each step whose `metric` is exactly 0.0; `grad_metric` is the gradient norm
    logged beside it (None when the log has none)."""

    def __init__(self, metric: str, grad_metric: str | None, hf_filtered: bool = False) -> None:
        self.metric = metric
        self.grad_metric = grad_metric
        self.hf_filtered = hf_filtered

    def update(self, step: int, metrics: Mapping[str, float | None]) -> list[Finding]:
        if metrics.get(self.metric) != 0.0:  # None (not logged), NaN and every other value
            return []
        norm = metrics.get(self.grad_metric) if self.grad_metric else None
        data = {"value": 0.0, "grad_norm": None if norm is None else str(norm)}
        if norm is not None and not math.isfinite(norm):
            beside = f"{self.grad_metric} {norm}"
        elif norm is None and self.hf_filtered:
            beside = "no gradient norm"
        else:
            beside = "" if norm is None else f"{self.grad_metric} {norm:g}"
            return [
                Finding.of(
                    "R107",
                    f"{self.metric} is exactly 0.0 at step {step}"
                    + (f" ({beside})" if beside else "")
                    + ": a language model's loss is not; a hidden non-finite loss (guarded: a "
                    "skipped update), or a batch with no target tokens",
                    step=step,
                    metric=self.metric,
                    data=data,
                )
            ]
        return [
            Finding.of(
                "R101",
                f"{self.metric} is logged as 0.0 at step {step} with {beside}: a non-finite "
                f"step; {_FILTER}",
                step=step,
                metric=self.metric,
                data={**data, "logged_as_zero": True},
            )
        ]
