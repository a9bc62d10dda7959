"""`trainguard check-precision`'s work, callable without the command line: the simulated
reduction at R ranks, the real collective measured at each requested size (local processes,
or the ranks of the torchrun job this process is one of), and the shadow run, as findings plus
the figures the command prints and puts in its JSON."""

from __future__ import annotations

from trainguard.errors import BadInputError


def collective_sizes(nproc: list[int] | None, collective: bool, in_job: bool) -> list[int]:
    """The local process counts to measure (`--nproc N ...`, and 2 and 4 for `--collective`),
    sorted; none may be asked for inside a torchrun job (its ranks are the collective)."""
    sizes = sorted({*(nproc or ()), *((2, 4) if collective else ())})
    if in_job and sizes:
        raise BadInputError(
            "--nproc (or --collective) given inside a torchrun job: the ranks of the job "
            "are the collective measured",
            "drop --nproc and --collective under torchrun (its --nproc-per-node decides)",
        )
    return sizes


def check_sizes(sizes: list[int], nproc: list[int] | None, oversubscribe: bool) -> None:
    """Bad input before any work: a size this machine cannot hold (without `oversubscribe`),
    or one the collective cannot be measured at. The sizes run one after the other."""
    from trainguard.checks.precision_collective import check_process_count
    from trainguard.util.processes import check_local_processes

    for n in sizes:
        if n >= 2:
            asked = f"--nproc {n}" if n in (nproc or ()) else f"--collective ({n} ranks)"
            check_local_processes(
                n,
                asked,
                lambda fits: (
                    f"measure at most {fits} processes here (--nproc "
                    f"{max(fits, 2)}), and more under torchrun across machines (every rank "
                    "joins, rank 0 reports)"
                ),
                oversubscribe,
            )
        check_process_count(n)


def check_precision(
    dtype: str,
    world_size: int,
    algorithm: str,
    elements: int,
    seed: int,
    *,
    sizes: list[int],
    in_job: bool = False,
    shadow_steps: int = 0,
) -> tuple[list, dict] | None:
    """(findings, extra): the reduction audit (`extra["reduction"]`), the measured collectives
    at `sizes` or, `in_job`, at the job's size (`"collective"`, `"collective_scale"`), and the
    shadow run of `shadow_steps` steps (`"shadow"`; none for fp32). None on a rank other than
    0 of the job: rank 0 speaks for it."""
    from trainguard.checks.precision_reduction import (
        check_reduction,
        reduction_findings,
        scale_verdict,
    )
    from trainguard.checks.precision_shadow import check_shadow

    findings, audit = check_reduction(dtype, world_size, algorithm, elements, seed)
    extra: dict = {"reduction": audit.to_dict()}
    measured: list = []
    if in_job:
        from trainguard.checks.precision_collective import measure_in_job

        rank, measured = measure_in_job(dtype, elements, seed)
        if rank != 0:
            return None
        sizes = [measured[0].world_size]
    elif sizes:
        from trainguard.checks.precision_collective import measure_collective

        for n in sizes:
            measured += measure_collective(n, dtype, elements, seed)
    if sizes:
        for a in measured:
            findings += reduction_findings(a)
        extra["collective"] = [a.to_dict() for a in measured]
        extra["collective_scale"] = [scale_verdict(n, audit, elements, seed) for n in sizes]
    if shadow_steps and dtype != "fp32":
        f_shadow, shadow = check_shadow(dtype, shadow_steps, seed=seed)
        findings += f_shadow
        extra["shadow"] = shadow
    return findings, extra
