"""Numerics of low-precision training: reduction simulation, the fp32-accumulating remedy
(`fp32_accumulate_hook`, a DDP communication hook), and the shadow-run growth exponent."""

from trainguard.numerics.comm_hook import fp32_accumulate_allreduce, fp32_accumulate_hook
from trainguard.numerics.reduction import (
    ALGORITHMS,
    DTYPES,
    ReductionAudit,
    audit_reduction,
    fit_bias_noise,
    reduce_sum,
    simulate_gradients,
)
from trainguard.numerics.shadow import ShadowResult, growth_exponent, shadow_run

__all__ = [
    "ALGORITHMS",
    "DTYPES",
    "ReductionAudit",
    "ShadowResult",
    "audit_reduction",
    "fit_bias_noise",
    "fp32_accumulate_allreduce",
    "fp32_accumulate_hook",
    "growth_exponent",
    "reduce_sum",
    "shadow_run",
    "simulate_gradients",
]
