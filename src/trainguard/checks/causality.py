"""Future-token leak (M101): resample the suffix after many cut points, prefix logits must hold.

Exact comparison: with dropout draws pinned and the batch shape unchanged, a causal model's
prefix logits are bitwise identical however the suffix changes. Catches hard routing flips
(expert choice) whose gradient is zero, which the gradient map (M102) cannot see.
"""

from __future__ import annotations

import torch

from trainguard.checks._model_runner import ModelRunner, logit_change, position_ranges
from trainguard.findings import Finding


def _variant_batches(
    runner: ModelRunner, x: torch.Tensor, cuts: list[int], batch_independent: bool
) -> list[tuple[torch.Tensor, list[int | None]]]:
    """Batches with suffixes resampled, and the cut of each row (None: row unchanged).

    A batch-independent model can test B cut points per forward, one per row; otherwise every
    row shares one cut so that the other rows' changes are future changes too.
    """
    batches = []
    b = x.shape[0]
    if batch_independent:
        for i in range(0, len(cuts), b):
            group = cuts[i : i + b]
            xv = x.clone()
            row_cuts: list[int | None] = [None] * b
            for row, c in enumerate(group):
                runner.resample_from(xv, row, c)
                row_cuts[row] = c
            batches.append((xv, row_cuts))
    else:
        for c in cuts:
            xv = x.clone()
            runner.resample_from(xv, slice(None), c)
            batches.append((xv, [c] * b))
    return batches


def check_future_leak(
    runner: ModelRunner,
    x: torch.Tensor,
    base: torch.Tensor,
    mode: str,
    cuts: list[int],
    batch_independent: bool,
    tol: float = 0.0,
) -> list[Finding]:
    """M101 if any prefix logit before a cut changes when the tokens from the cut on change."""
    leaks: list[dict] = []
    with runner.timed("future_leak") as stats:
        for xv, row_cuts in _variant_batches(runner, x, cuts, batch_independent):
            logits, _ = runner.forward(xv, stats)
            delta = logit_change(logits, base)  # (B, T), finite entries only
            for row, c in enumerate(row_cuts):
                if c is None:
                    continue
                changed = (delta[row, :c] > tol).nonzero().flatten().tolist()
                if changed:
                    leaks.append(
                        {
                            "cut": c,
                            "row": row,
                            "positions": changed,
                            "max_change": float(delta[row, :c].max()),  # deliberate host sync
                        }
                    )
    if not leaks:
        return []
    leaky_cuts = sorted({leak["cut"] for leak in leaks})
    earliest = min(min(leak["positions"]) for leak in leaks)
    biggest = max(leak["max_change"] for leak in leaks)
    by_cut: dict[int, set[int]] = {}
    for leak in leaks:
        by_cut.setdefault(leak["cut"], set()).update(leak["positions"])
    return [
        Finding.of(
            "M101",
            f"future-token leak in {mode} mode: changing the tokens from position c on changed "
            f"the logits at earlier positions for {len(leaky_cuts)} of {len(cuts)} cut points "
            f"(cuts {position_ranges(leaky_cuts)}; earliest changed position {earliest}; "
            f"max |delta logit| {biggest:.3g})",
            where=f"{mode} mode",
            data={
                "mode": mode,
                "cuts_tested": cuts,
                "leaky_cuts": leaky_cuts,
                "changed_positions": {
                    str(c): position_ranges(sorted(p)) for c, p in sorted(by_cut.items())
                },
                "earliest_changed_position": earliest,
                "max_change": biggest,
            },
        )
    ]
