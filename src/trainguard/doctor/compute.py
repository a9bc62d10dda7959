"""Compute against known answers: matmuls and an attention block in the recipe's dtype,
compared with float64, run twice for bitwise repeatability, timed; and a short sustained burn.

Error bounds (first order, with fp32 accumulation as every backend uses for fp32, bf16 and
fp16 matmuls): for C = A @ B with inner length K, elementwise

    |C - C64| <= (u_out + 2 u_in + K u_acc) (|A| @ |B|)

where u_out is the output dtype's unit roundoff (2^-24 fp32, 2^-8 bf16, 2^-11 fp16), u_acc
fp32's, and u_in TF32's 2^-11 when torch allows TF32 matmuls on CUDA (else 0: inputs are
exact in the dtype). Attention's output is a convex combination of V's rows, so its error is
measured against max|V| with the bound 2 u_out + 2 u_in + (D + T) u_acc. Measured on this
project's CPU: 2-4 u (fp32) and 0.4 u (bf16), far inside; a flipped exponent bit is orders of
magnitude outside.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainguard.doctor.report import LocalResult, RankContext

UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
U_ACC = 2.0**-24
U_TF32 = 2.0**-11
THROTTLE_RATIO = 1.5  # last quarter of the burn vs the first (H404)
CHUNKS = 16
_SEED = 20240601


def tf32_active(device: torch.device) -> bool:
    return device.type == "cuda" and bool(torch.backends.cuda.matmul.allow_tf32)


def matmul_bound(dtype: torch.dtype, k: int, tf32: bool = False) -> float:
    u_in = U_TF32 if tf32 and dtype == torch.float32 else 0.0
    return UNIT_ROUNDOFF[dtype] + 2 * u_in + k * U_ACC


def attention_bound(dtype: torch.dtype, seq: int, head_dim: int, tf32: bool = False) -> float:
    u_in = U_TF32 if tf32 and dtype == torch.float32 else 0.0
    return 2 * UNIT_ROUNDOFF[dtype] + 2 * u_in + (seq + head_dim) * U_ACC


def known_input(shape: tuple[int, ...], seed: int, ctx: RankContext) -> torch.Tensor:
    """A seeded normal tensor, drawn in float64 on the CPU (the same on every rank and
    machine), rounded to the dtype on the device."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(ctx.device, ctx.dtype)


def flip_top_exponent_bit(t: torch.Tensor) -> None:
    """`bitflip/rR`: flip the top exponent bit of one element, in place."""
    bits = {4: (torch.int32, 30), 2: (torch.int16, 14)}[t.element_size()]
    t.view(bits[0]).view(-1)[0] ^= 1 << bits[1]


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {4: torch.int32, 2: torch.int16, 8: torch.int64}[a.element_size()]
    return bool(torch.equal(a.view(ints), b.view(ints)))


def _result_findings(
    ctx: RankContext, what: str, first: torch.Tensor, second: torch.Tensor, err: float, bound: float
) -> LocalResult:
    out = LocalResult()
    finite = bool(torch.isfinite(first).all())
    if not finite or not err <= bound:
        shown = "non-finite values" if not finite else f"max relative error {err:.3g}"
        out.findings.append(
            ctx.who.finding(
                "H401",
                f"{what} in {ctx.plan.dtype}: {shown} against float64, bound {bound:.3g}",
                check=what,
                error=None if not finite else err,
                bound=bound,
            )
        )
    if not bitwise_equal(first, second):
        out.findings.append(
            ctx.who.finding("H402", f"{what}: two runs on the same inputs differ", check=what)
        )
    return out


def check_matmul(ctx: RankContext) -> LocalResult:
    n = ctx.sizes.matmul_n
    a, b = known_input((n, n), _SEED, ctx), known_input((n, n), _SEED + 1, ctx)

    def run() -> torch.Tensor:
        c = a @ b
        if ctx.planted("bitflip"):
            flip_top_exponent_bit(c)  # a stuck bit: wrong every time, the same way
        return c

    first, second = run(), run()
    a64, b64 = a.double(), b.double()
    scale = (a64.abs() @ b64.abs()).clamp_min(torch.finfo(torch.float64).tiny)
    err = float(((first.double() - a64 @ b64).abs() / scale).max())
    out = _result_findings(
        ctx, "matmul", first, second, err, matmul_bound(ctx.dtype, n, tf32_active(ctx.device))
    )
    del a64, b64, scale
    seconds = ctx.stopwatch.fastest(run, ctx.sizes.reps, repeat=ctx.slowdown)
    out.timings["matmul"] = seconds
    out.figures |= {
        "matmul_n": n,
        "matmul_error": err if math.isfinite(err) else None,  # JSON has no NaN
        "matmul_gflops": 2 * n**3 / seconds / 1e9,
    }
    return out


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention in float64, written out."""
    q, k, v = q.double(), k.double(), v.double()
    seq, dim = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(dim)
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v


def check_attention(ctx: RankContext) -> LocalResult:
    shape = ctx.sizes.attention
    q, k, v = (known_input(shape, _SEED + 10 + i, ctx) for i in range(3))

    def run() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    first, second = run(), run()
    err = float((first.double() - reference_attention(q, k, v)).abs().max() / v.abs().max())
    bound = attention_bound(ctx.dtype, shape[2], shape[3], tf32_active(ctx.device))
    out = _result_findings(ctx, "attention", first, second, err, bound)
    seconds = ctx.stopwatch.fastest(run, ctx.sizes.reps, repeat=ctx.slowdown)
    out.timings["attention"] = seconds
    out.figures |= {
        "attention_shape": list(shape),
        "attention_error": err if math.isfinite(err) else None,
    }
    out.figures["attention_ms"] = seconds * 1e3
    return out


def check_burn(ctx: RankContext) -> LocalResult:
    """Back-to-back matmuls for about `burn_s` seconds in `CHUNKS` timed chunks: the sustained
    throughput (GFLOP/s), and whether the last quarter's chunks ran much slower than the
    first's (throttling). Quarters are compared by their fastest chunk: interference from
    other processes slows some chunks, a throttled device all of them."""
    n = ctx.sizes.matmul_n
    a, b = known_input((n, n), _SEED + 2, ctx), known_input((n, n), _SEED + 3, ctx)
    watch = ctx.stopwatch

    def step() -> None:
        for _ in range(ctx.slowdown):
            torch.mm(a, b)

    one = max(watch.fastest(step, 3), 1e-7)
    per_chunk = max(1, math.ceil(ctx.sizes.burn_s / CHUNKS / one))
    chunks = [watch.time(step, per_chunk) for _ in range(CHUNKS)]
    chunk_gflop = 2 * n**3 * per_chunk / 1e9
    q = CHUNKS // 4
    first, last = min(chunks[:q]), min(chunks[-q:])
    out = LocalResult()
    # The fleet compares the fastest chunk (seconds per GFLOP): the device's own speed,
    # whatever else shared its core for a moment.
    out.timings["burn"] = min(chunks) / chunk_gflop
    out.figures |= {
        "burn_gflops": chunk_gflop * CHUNKS / sum(chunks),
        "burn_s": sum(chunks),
        "burn_first_last_quarter_s": [first, last],
    }
    if last > THROTTLE_RATIO * first:
        out.findings.append(
            ctx.who.finding(
                "H404",
                f"during a {sum(chunks):.1f}s burn the last quarter's fastest chunk took "
                f"{last / first:.2f}x the first quarter's",
                first_s=first,
                last_s=last,
            )
        )
    return out
