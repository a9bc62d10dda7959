"""Bias or variance: a shadow run in the candidate precision against float64.

Both runs start from the same weights (the candidate's, so the initial rounding is shared)
and see the same batches; plain SGD keeps the update rule transparent. The distance
d_k = ||theta_k - theta_ref_k|| is fitted as d_k ~ k^p: p near 1 is a bias that compounds
(updates swallowed by rounding to nearest push the same way every step), p near 0.5 is noise
that averages out (a random walk, e.g. stochastic rounding).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainguard.numerics.logits import extract_logits
from trainguard.numerics.reduction import dtype_of

LossFn = Callable[[nn.Module, torch.Tensor], torch.Tensor]


@dataclass
class ShadowResult:
    """Distances to the float64 run per step and their growth exponent."""

    dtype: str
    rounding: str
    steps: int
    lr: float
    exponent: float
    distances: list[float] = field(default_factory=list)
    relative_final: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def growth_exponent(distances: Sequence[float]) -> float:
    """Least-squares slope of log d_k on log k (k = 1, 2, ...) over the positive d_k; NaN if
    fewer than three are positive."""
    pts = [(math.log(k), math.log(d)) for k, d in enumerate(distances, 1) if d > 0]
    if len(pts) < 3:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def lm_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of a model mapping ids (B, T) to logits (B, T, V)."""
    logits = extract_logits(model(batch[:, :-1]))
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


def round_to(x: torch.Tensor, dtype: torch.dtype, rounding: str, gen: torch.Generator):
    """x rounded to `dtype`: to nearest, or stochastically (unbiased: E[round(x)] = x)."""
    if rounding == "nearest" or dtype == torch.float32:
        return x.to(dtype)
    down = x.to(dtype)
    # The neighbour on the other side of x, and the chance of rounding to it.
    toward = torch.where(x.to(torch.float64) > down.double(), torch.inf, -torch.inf).to(dtype)
    other = torch.nextafter(down, toward)
    gap = (other.double() - down.double()).abs()
    frac = torch.where(gap > 0, (x.double() - down.double()).abs() / gap, torch.zeros_like(gap))
    up = torch.rand(x.shape, generator=gen, dtype=torch.float64) < frac
    return torch.where(up, other, down)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def shadow_run(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    dtype: str = "bf16",
    lr: float = 1e-3,
    rounding: str = "nearest",
    loss_fn: LossFn = lm_loss,
    seed: int = 0,
) -> ShadowResult:
    """SGD for len(batches) steps with weights stored (and computed) in `dtype`, rounding the
    updated weights to nearest or stochastically, against float64 from the same start.
    The caller's model is not modified (both runs work on copies)."""
    low = dtype_of(dtype)
    gen = torch.Generator().manual_seed(seed)
    cand = copy.deepcopy(model).to(low).train(False)
    ref = copy.deepcopy(cand).double()
    steps = len(batches)
    distances = []
    for batch in batches:
        for net in (cand, ref):
            net.zero_grad(set_to_none=True)
            loss_fn(net, batch).backward()
        with torch.no_grad():
            for pc, pr in zip(cand.parameters(), ref.parameters(), strict=True):
                if pr.grad is None:
                    continue
                pr.sub_(lr * pr.grad)
                if pc.grad is not None:
                    # The update is computed in fp32, then stored in the low-precision dtype.
                    new = pc.float() - lr * pc.grad.float()
                    pc.copy_(round_to(new, low, rounding, gen))
        distances.append(float((_flat(cand) - _flat(ref)).norm()))  # deliberate host sync
    scale = float(_flat(ref).norm()) or 1.0
    return ShadowResult(
        dtype=dtype,
        rounding=rounding,
        steps=steps,
        lr=lr,
        exponent=growth_exponent(distances),
        distances=distances,
        relative_final=distances[-1] / scale if distances else 0.0,
    )


def pattern_batches(
    vocab_size: int, seq_len: int, batch_size: int, steps: int, seed: int = 0
) -> list[torch.Tensor]:
    """`steps` batches (B, T+1) of a learnable pattern, x[t+1] = (5 x[t] + 3) mod V from random
    starts: the gradient keeps its direction over steps, as early in real training, so a
    biased update error accumulates visibly (random tokens would make the gradient itself a
    random walk and hide the difference)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        x = torch.empty(batch_size, seq_len + 1, dtype=torch.long)
        x[:, 0] = torch.randint(0, vocab_size, (batch_size,), generator=gen)
        for t in range(seq_len):
            x[:, t + 1] = (5 * x[:, t] + 3) % vocab_size
        out.append(x)
    return out
