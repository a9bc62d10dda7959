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


def smallest_biased_size(
    dtype: str, algorithm: str, up_to: int, n_elements: int = 4096, seed: int = 0
) -> int | None:
    """The smallest world size (powers of two, then `up_to`) at which the simulation shows a
    bias (N101), or None when it shows none up to `up_to` ranks."""
    from trainguard.numerics.reduction import MAX_SIMULATED_ENTRIES

    sizes, w = [], 2
    while w < up_to:
        sizes.append(w)
        w *= 2
    sizes.append(up_to)
    for size in sizes:
        if size * n_elements > MAX_SIMULATED_ENTRIES:
            return None
        if audit_reduction(dtype, size, algorithm, n_elements, seed).biased:
            return size
    return None


def scale_verdict(
    measured: int,
    scale: ReductionAudit,
    n_elements: int = 4096,
    seed: int = 0,
) -> dict:
    """Can a real collective of `measured` ranks show the bias the simulation predicts at
    `scale.world_size` ranks? Rounding bias grows with the number of additions, so a small
    group can look clean while the same reduction at scale shrinks every gradient.

    Returns {"world_size", "scale_world_size", "predicted_bias", "scale_bias",
    "shows_bias" (True, False, or None when nothing is predicted), "smallest_showing",
    "verdict"} with the verdict in words."""
    dtype, algorithm, big = scale.dtype, scale.algorithm, scale.world_size
    here = audit_reduction(dtype, measured, algorithm, n_elements, seed)
    out = {
        "world_size": measured,
        "scale_world_size": big,
        "algorithm": algorithm,
        "predicted_bias": here.bias,
        "scale_bias": scale.bias,
        "shows_bias": None,
        "smallest_showing": None,
    }
    if not scale.biased:
        out["verdict"] = (
            f"the simulation predicts no bias for a {dtype} {algorithm} sum at {big} ranks "
            f"either (|1 - slope| = {scale.bias:.2g}): a clean result at {measured} ranks is "
            "all there is to show"
        )
        return out
    if here.biased:
        out["shows_bias"] = True
        out["verdict"] = (
            f"{measured} ranks can show it: the simulation predicts |1 - slope| = "
            f"{here.bias:.2g} there ({scale.bias:.2g} at {big}); a clean real collective at "
            f"{measured} ranks would mean the real reduction is better than the simulated one"
        )
        return out
    first = smallest_biased_size(dtype, algorithm, big, n_elements, seed)
    out["shows_bias"] = False
    out["smallest_showing"] = first
    out["verdict"] = (
        f"{measured} ranks are too small to show the bias the simulation predicts at {big}: "
        f"|1 - slope| = {here.bias:.2g} at {measured} ranks (below the {BIAS_LIMIT:g} limit or "
        f"within 4 standard errors) against {scale.bias:.2g} at {big}; a clean result here "
        "says nothing about the run at scale"
        + (
            f". The simulation first shows it at {first} ranks: measure there "
            f"(--nproc {first}, or torchrun across machines)"
            if first is not None
            else ""
        )
    )
    return out
