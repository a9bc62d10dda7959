"""Low-precision gradient reduction, simulated, measured against a float64 reference.

R ranks each hold a gradient g_r = s + n_r: a shared signal s plus per-rank noise n_r, with
per-element magnitudes spread log-uniformly over 1e-5..1e-2 (the range of LLM gradient
entries), rounded to the dtype the ranks hold. The reduction is emulated element-wise exactly
as the hardware rounds it: each addition's result is rounded to the dtype (torch rounds a
bf16/fp16 add to nearest even, as GPUs do).

- ring: a ring reduce-scatter; each chunk is accumulated sequentially around the ring,
  rounding after every add (NCCL's ring all-reduce keeps partial sums in the dtype).
- tree: pairwise (binary tree) reduction, rounding at every level.
- fp32-accumulate: upcast to fp32, ring in fp32, one rounding back to the dtype at the end
  (what `fp32_accumulate_hook` does).

The reduced sum y is regressed on the exact sum x (float64 of the same rounded inputs), each
entry divided by its magnitude (the RMS of its per-rank values) so that every entry counts
alike and the few largest do not decide the fit: slope = <x, y> / <x, x> is the bias
(swamping shrinks sums: slope < 1), the residual RMS relative to RMS(x) is the noise. A bias
is reported only when it is also 4 standard errors from 1, so few entries cannot fake one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
# Ranks x entries simulated at most: the float64 gradients alone take 8 bytes each (2 GiB).
MAX_SIMULATED_ENTRIES = 2**28
ALGORITHMS = ("ring", "tree", "fp32-accumulate")

BIAS_LIMIT = 1e-3
"""|1 - slope| above this is an error (N101): the sum is shrunk by the same factor each step."""
NOISE_LIMIT = 1e-2
"""Residual RMS above 1% of the exact sum's RMS is a warning (N102)."""


@dataclass
class ReductionAudit:
    """Bias and noise of one reduction against float64."""

    dtype: str
    algorithm: str
    world_size: int
    n_elements: int
    slope: float
    bias: float
    noise: float
    source: str = "simulated"
    slope_stderr: float = 0.0

    @property
    def biased(self) -> bool:
        return self.bias > BIAS_LIMIT and self.bias > 4.0 * self.slope_stderr

    @property
    def noisy(self) -> bool:
        return self.noise > NOISE_LIMIT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dtype_of(name: str) -> torch.dtype:
    from trainguard.errors import BadInputError

    if name not in DTYPES:
        raise BadInputError(
            f"unknown dtype {name!r}", f"use one of {', '.join(DTYPES)} (e.g. --dtype bf16)"
        )
    return DTYPES[name]


def simulate_gradients(
    world_size: int,
    n_elements: int,
    dtype: torch.dtype,
    seed: int = 0,
    noise_ratio: float = 1.0,
) -> torch.Tensor:
    """Per-rank gradients (R, N) in `dtype`: shared signal plus `noise_ratio` times as much
    independent per-rank noise, magnitudes log-uniform over 1e-5..1e-2 per element."""
    gen = torch.Generator().manual_seed(seed)
    scale = 10.0 ** (-5.0 + 3.0 * torch.rand(n_elements, generator=gen, dtype=torch.float64))
    signal = scale * torch.randn(n_elements, generator=gen, dtype=torch.float64)
    noise = torch.randn(world_size, n_elements, generator=gen, dtype=torch.float64)
    return (signal + noise_ratio * scale * noise).to(dtype)  # (R, N)


def _ring(x: torch.Tensor, acc_dtype: torch.dtype) -> torch.Tensor:
    # In a real ring each chunk starts at a different rank; the simulated ranks are
    # exchangeable, so one order (0..R-1) has the same statistics and keeps rows contiguous.
    acc = x[0].to(acc_dtype)
    for r in range(1, x.shape[0]):
        acc = acc + x[r].to(acc_dtype)  # rounded to acc_dtype after every add
    return acc


def _tree(x: torch.Tensor) -> torch.Tensor:
    while x.shape[0] > 1:
        if x.shape[0] % 2:
            x = torch.cat([x[:-2], (x[-2] + x[-1]).unsqueeze(0)])
            continue
        x = x[0::2] + x[1::2]  # each level rounds to the dtype
    return x[0]


def reduce_sum(x: torch.Tensor, algorithm: str) -> torch.Tensor:
    """Sum over ranks (dim 0) of `x` as `algorithm` computes it in x's dtype."""
    if algorithm == "ring":
        return _ring(x, x.dtype)
    if algorithm == "tree":
        return _tree(x)
    if algorithm == "fp32-accumulate":
        return _ring(x, torch.float32).to(x.dtype)
    from trainguard.errors import BadInputError

    raise BadInputError(
        f"unknown reduction algorithm {algorithm!r}", f"use one of {', '.join(ALGORITHMS)}"
    )


def fit_bias_noise(
    reduced: torch.Tensor, exact: torch.Tensor, scale: torch.Tensor | None = None
) -> tuple[float, float]:
    """(slope, noise): least-squares slope through the origin of reduced on exact, and the
    residual RMS relative to the RMS of exact; entries divided by `scale` first if given."""
    slope, noise, _ = fit_with_stderr(reduced, exact, scale)
    return slope, noise


def fit_with_stderr(
    reduced: torch.Tensor, exact: torch.Tensor, scale: torch.Tensor | None = None
) -> tuple[float, float, float]:
    """(slope, noise, standard error of the slope); see `fit_bias_noise`."""
    y, x = reduced.double().flatten(), exact.double().flatten()
    if scale is not None:
        w = scale.double().flatten()
        keep = w > 0
        y, x = y[keep] / w[keep], x[keep] / w[keep]
    xx = float(x @ x)
    if xx == 0.0:
        return 1.0, 0.0, 0.0
    slope = float(x @ y) / xx
    resid = y - slope * x
    dof = max(1, x.numel() - 1)
    stderr = float(resid.norm()) / (dof**0.5) / xx**0.5
    return slope, float(resid.norm() / x.norm()), stderr


def entry_scale(per_rank: torch.Tensor) -> torch.Tensor:
    """Magnitude of each gradient entry: the RMS of its per-rank values (R, N) -> (N,)."""
    return per_rank.double().pow(2).mean(0).sqrt()


def audit_reduction(
    dtype: str,
    world_size: int,
    algorithm: str = "ring",
    n_elements: int = 4096,
    seed: int = 0,
    noise_ratio: float = 1.0,
) -> ReductionAudit:
    """Simulate `world_size` ranks' gradients reduced in `dtype` by `algorithm`."""
    from trainguard.errors import BadInputError

    if world_size < 1:
        raise BadInputError(f"world size {world_size} < 1", "give --world-size >= 1")
    if world_size * n_elements > MAX_SIMULATED_ENTRIES:
        raise BadInputError(
            f"simulating {world_size} ranks x {n_elements} gradient entries needs "
            f"{world_size * n_elements * 8 / 2**30:.0f} GiB (cap: {MAX_SIMULATED_ENTRIES:,} "
            "entries, 2 GiB)",
            f"lower --world-size or --elements so that their product is at most "
            f"{MAX_SIMULATED_ENTRIES:,} (e.g. --world-size {world_size} --elements "
            f"{max(16, MAX_SIMULATED_ENTRIES // world_size)})",
        )
    if algorithm not in ALGORITHMS:
        raise BadInputError(
            f"unknown reduction algorithm {algorithm!r}", f"use one of {', '.join(ALGORITHMS)}"
        )
    x = simulate_gradients(world_size, n_elements, dtype_of(dtype), seed, noise_ratio)
    exact = x.double().sum(0)
    slope, noise, se = fit_with_stderr(reduce_sum(x, algorithm), exact, entry_scale(x))
    return ReductionAudit(
        dtype, algorithm, world_size, n_elements, slope, abs(1 - slope), noise, "simulated", se
    )
