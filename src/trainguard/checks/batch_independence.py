"""Batch independence (M103): a sample's logits must not change when its batch-mates change.

Normalisation statistics over the batch (BatchNorm in train mode) and MoE routing groups or
capacity shared by the batch make one sample depend on the others. Exact comparison, with the
batch shape and dropout draws unchanged.
"""

from __future__ import annotations

import torch

from trainguard.checks._model_runner import ModelRunner, logit_change
from trainguard.findings import Finding


def kept_rows(batch: int) -> list[int]:
    """The rows held fixed: the first and, when there are at least three, the last."""
    return [0, batch - 1] if batch >= 3 else [0]


def check_batch_independence(
    runner: ModelRunner, x: torch.Tensor, base: torch.Tensor, mode: str, tol: float = 0.0
) -> list[Finding]:
    """M103 if a kept row's logits change when every other row of the batch is resampled."""
    b = x.shape[0]
    keep = kept_rows(b)
    with runner.timed("batch_independence") as stats:
        xv = x.clone()
        for row in range(b):
            if row not in keep:
                runner.resample_from(xv, row, 0)
        logits, _ = runner.forward(xv, stats)
        delta = logit_change(logits, base)  # (B, T)
    changed = {row: (delta[row] > tol).nonzero().flatten().tolist() for row in keep}
    changed = {row: pos for row, pos in changed.items() if pos}
    if not changed:
        return []
    biggest = float(max(delta[row].max() for row in changed))  # deliberate host sync
    n_pos = sum(len(p) for p in changed.values())
    return [
        Finding.of(
            "M103",
            f"batch dependence in {mode} mode: changing the other {b - len(keep)} samples of "
            f"the batch changed the logits of kept sample(s) {sorted(changed)} at {n_pos} "
            f"position(s) (max |delta logit| {biggest:.3g})",
            where=f"{mode} mode",
            data={
                "mode": mode,
                "batch_size": b,
                "kept_rows": keep,
                "changed_positions": {str(r): len(p) for r, p in changed.items()},
                "max_change": biggest,
            },
        )
    ]
