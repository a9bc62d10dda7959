"""Gradient leak map (M102): d logits[t] / d embedding[s] must be exactly zero for every s > t.

A hook on the token embedding output makes it a leaf; a random projection of the logits of
the positions before a cut is differentiated with respect to it, once per group of cuts.
Catches faint, smooth leaks below the rounding of the logits, which the perturbation test
(M101) can miss. Where it finds a leak, a second pass maps single earlier positions to the
later positions that feed them.
"""

from __future__ import annotations

import torch

from trainguard.checks._model_runner import ModelRunner, position_ranges
from trainguard.findings import Finding


def _target_groups(cuts: list[int], batch: int, batch_independent: bool) -> list[list[int | None]]:
    """Per backward pass, the cut of each row: one cut per row when rows are independent."""
    if batch_independent:
        groups = []
        for i in range(0, len(cuts), batch):
            g: list[int | None] = list(cuts[i : i + batch])
            groups.append(g + [None] * (batch - len(g)))
        return groups
    return [[c] * batch for c in cuts]


def _feeding(
    logits: torch.Tensor,
    emb: torch.Tensor,
    proj: torch.Tensor,
    groups: list[list[int | None]],
    single: bool,
    tol: float,
    stats,
) -> dict[int, list[int]]:
    """{target: later positions with a nonzero gradient}; target = cut (single=False: the
    positions before it) or one position (single=True: just that position)."""
    t_len = logits.shape[1]
    found: dict[int, set[int]] = {}
    # Non-finite logits (M108) stay out of the loss: one NaN there makes every gradient NaN.
    logits = torch.where(torch.isfinite(logits), logits, torch.zeros_like(logits))
    for k, group in enumerate(groups):
        mask = torch.zeros(logits.shape[:2], device=logits.device)  # (B, T)
        for row, c in enumerate(group):
            if c is None:
                continue
            if single:
                mask[row, c] = 1.0
            else:
                mask[row, :c] = 1.0
        loss = (logits * proj * mask.unsqueeze(-1)).sum()
        (g,) = torch.autograd.grad(loss, emb, retain_graph=k < len(groups) - 1, allow_unused=True)
        stats.backwards += 1
        if g is None:  # the logits do not depend on the embedding at all
            continue
        g = g.detach().float()
        size = torch.where(torch.isfinite(g), g.abs(), torch.zeros_like(g)).amax(dim=-1)  # (B, T)
        for row, c in enumerate(group):
            if c is None:
                continue
            later = c + 1 if single else c
            if later >= t_len:
                continue
            hit = ((size[row, later:] > tol).nonzero().flatten() + later).tolist()
            if hit:
                found.setdefault(c, set()).update(hit)
    return {c: sorted(s) for c, s in found.items()}


def check_gradient_leak(
    runner: ModelRunner,
    x: torch.Tensor,
    mode: str,
    cuts: list[int],
    batch_independent: bool,
    tol: float = 0.0,
    refine: int = 8,
) -> list[Finding]:
    """M102 with the map of later positions feeding earlier ones; M107 if no embedding found."""
    b = x.shape[0]
    with runner.timed("gradient_leak") as stats:
        logits, emb = runner.forward(x, stats, grad=True)
        if emb is None or not logits.requires_grad:
            return [
                Finding.of(
                    "M107",
                    f"gradient leak map skipped in {mode} mode: no nn.Embedding received the "
                    "token ids",
                    where=f"{mode} mode",
                    data={"mode": mode, "check": "gradient_leak"},
                )
            ]
        gen = torch.Generator().manual_seed(runner.seed + 7)
        proj = torch.randn(logits.shape, generator=gen).to(logits.device, logits.dtype)
        groups = _target_groups(cuts, b, batch_independent)
        by_cut = _feeding(logits, emb, proj, groups, False, tol, stats)
        if not by_cut:
            return []
        # Refine: which later positions feed single positions just before the leaky cuts.
        targets = sorted({c - 1 for c in by_cut})
        if len(targets) > refine:
            step = len(targets) / refine
            targets = sorted({targets[int(i * step)] for i in range(refine)})
        logits, emb = runner.forward(x, stats, grad=True)
        groups = _target_groups(targets, b, batch_independent)
        by_position = _feeding(logits, emb, proj, groups, True, tol, stats)
    leaky_cuts = sorted(by_cut)
    feeding_map = {str(t): position_ranges(s) for t, s in sorted(by_position.items())}
    example = ""
    if by_position:
        t0, s0 = next(iter(sorted(by_position.items())))
        example = f"; e.g. position {t0} is fed by later positions {position_ranges(s0)}"
    return [
        Finding.of(
            "M102",
            f"gradient leak in {mode} mode: the logits before {len(leaky_cuts)} of {len(cuts)} "
            f"cut points have a nonzero gradient from later positions (cuts "
            f"{position_ranges(leaky_cuts)}){example}",
            where=f"{mode} mode",
            data={
                "mode": mode,
                "cuts_tested": cuts,
                "leaky_cuts": leaky_cuts,
                "later_positions_feeding_prefix": {
                    str(c): position_ranges(s) for c, s in sorted(by_cut.items())
                },
                "feeding_map": feeding_map,
            },
        )
    ]
