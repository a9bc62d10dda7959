"""`trainguard check-precision [--dtype fp32|bf16|fp16] [--world-size R]
[--algorithm ring|tree|fp32-accumulate] [--nproc N ...] [--json]`: is the gradient reduction
biased?

The simulation predicts the bias at R ranks; `--nproc N` measures the real collective with N
local processes, and under torchrun every rank of the job joins the measurement (several
machines: the sizes where the bias shows). Each measured size says whether it is large enough
to show the bias the simulation predicts at R (`collective_scale`)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from trainguard.cli.common import console, emit
from trainguard.config.schema import SEED_MAX
from trainguard.errors import BadInputError, ExitStatus


def register(app: typer.Typer) -> None:
    @app.command("check-precision")
    def check_precision_cmd(
        dtype: Annotated[str, typer.Option(help="Gradient dtype: fp32, bf16 or fp16.")] = "bf16",
        world_size: Annotated[
            int, typer.Option(min=1, max=2**24, help="Ranks R in the reduction.")
        ] = 8,
        algorithm: Annotated[
            str, typer.Option(help="Reduction: ring, tree or fp32-accumulate (the remedy).")
        ] = "ring",
        elements: Annotated[int, typer.Option(min=16, help="Gradient entries simulated.")] = 4096,
        collective: Annotated[
            bool,
            typer.Option(
                help="Also measure the real torch.distributed (gloo) all_reduce with 2 and 4 "
                "local processes, and DDP with fp32_accumulate_hook (= --nproc 2 --nproc 4)."
            ),
        ] = False,
        nproc: Annotated[
            list[int] | None,
            typer.Option(
                "--nproc",
                help="Measure the real collective with N local processes (gloo; repeat for "
                "several sizes). For more ranks than one machine holds, run check-precision "
                "under torchrun: every rank joins, rank 0 reports.",
            ),
        ] = None,
        oversubscribe: Annotated[
            bool,
            typer.Option(
                "--oversubscribe",
                help="With --nproc or --collective: start more processes than this machine "
                "has cores (or memory for) anyway; without it such a count is refused before "
                "anything starts.",
            ),
        ] = False,
        shadow_steps: Annotated[
            int,
            typer.Option(
                min=0,
                help="Shadow run of K SGD steps with weights in --dtype against float64 "
                "(small built-in model); 0 skips it.",
            ),
        ] = 32,
        seed: Annotated[
            int, typer.Option(min=0, max=SEED_MAX, help="Seed of the simulated gradients.")
        ] = 0,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Bias (slope against float64) and noise of a low-precision gradient reduction; with
        --shadow-steps, whether the precision error grows like a bias or like noise."""
        from trainguard.checks.precision_reduction import (
            check_reduction,
            reduction_findings,
            scale_verdict,
        )
        from trainguard.checks.precision_shadow import check_shadow
        from trainguard.train.launch import under_launcher

        sizes = sorted({*(nproc or ()), *((2, 4) if collective else ())})
        in_job = under_launcher() and int(os.environ.get("WORLD_SIZE", "1")) > 1
        if in_job and sizes:
            raise BadInputError(
                "--nproc (or --collective) given inside a torchrun job: the ranks of the job "
                "are the collective measured",
                "drop --nproc and --collective under torchrun (its --nproc-per-node decides)",
            )
        if sizes:
            from trainguard.checks.precision_collective import check_process_count
            from trainguard.util.processes import check_local_processes

            for n in sizes:  # bad input before any work; the sizes run one after the other
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
        findings, audit = check_reduction(dtype, world_size, algorithm, elements, seed)
        extra: dict = {"reduction": audit.to_dict()}
        measured: list = []
        if in_job:
            from trainguard.checks.precision_collective import measure_in_job

            rank, measured = measure_in_job(dtype, elements, seed)
            if rank != 0:
                raise typer.Exit(ExitStatus.OK)  # rank 0 speaks for the job
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
        if not as_json:
            console.print(
                f"{dtype} {algorithm} reduction over {world_size} ranks: slope "
                f"{audit.slope:.6f} (bias {audit.bias:.2e}), noise {audit.noise:.2e}",
                markup=False,
            )
            for a in extra.get("collective", []):
                console.print(
                    f"{a['source']} world {a['world_size']} {a['algorithm']}: bias "
                    f"{a['bias']:.2e}, noise {a['noise']:.2e}",
                    markup=False,
                )
            for v in extra.get("collective_scale", []):
                console.print(f"world {v['world_size']}: {v['verdict']}", markup=False)
            for name, s in extra.get("shadow", {}).items():
                console.print(
                    f"shadow run ({name} rounding): error grows like steps^{s['exponent']:.2f}",
                    markup=False,
                )
        emit(findings, as_json, extra=extra, title="check-precision")
