"""Reduction bias and noise (N101, N102) of a simulated or measured low-precision reduction."""

from __future__ import annotations

from trainguard.findings import Finding
from trainguard.numerics.reduction import (
    BIAS_LIMIT,
    NOISE_LIMIT,
    ReductionAudit,
    audit_reduction,
)


def reduction_findings(audit: ReductionAudit) -> list[Finding]:
    """N101 when |1 - slope| > 1e-3 (a compounding bias), N102 when noise > 1%."""
    where = f"{audit.source} {audit.algorithm}, {audit.dtype}, world size {audit.world_size}"
    findings = []
    if audit.biased:
        direction = "shrinks" if audit.slope < 1 else "inflates"
        findings.append(
            Finding.of(
                "N101",
                f"biased reduction: a {audit.dtype} {audit.algorithm} sum over "
                f"{audit.world_size} ranks {direction} the gradient by a factor {audit.slope:.4f} "
                f"(|1 - slope| = {audit.bias:.2g} > {BIAS_LIMIT:g}, standard error "
                f"{audit.slope_stderr:.1g}); the error compounds over "
                "steps",
                where=where,
                data=audit.to_dict(),
            )
        )
    if audit.noisy:
        findings.append(
            Finding.of(
                "N102",
                f"noisy reduction: rounding noise of a {audit.dtype} {audit.algorithm} sum over "
                f"{audit.world_size} ranks is {audit.noise:.2%} of the gradient "
                f"(bound {NOISE_LIMIT:.0%})",
                where=where,
                data=audit.to_dict(),
            )
        )
    return findings


def check_reduction(
    dtype: str, world_size: int, algorithm: str = "ring", n_elements: int = 4096, seed: int = 0
) -> tuple[list[Finding], ReductionAudit]:
    """Simulate the reduction (see `trainguard.numerics.reduction`) and judge it."""
    audit = audit_reduction(dtype, world_size, algorithm, n_elements, seed)
    return reduction_findings(audit), audit
