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
from trainguard.errors import ExitStatus


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
        from trainguard.checks.precision_check import (
            check_precision,
            check_sizes,
            collective_sizes,
        )
        from trainguard.train.launch import under_launcher

        in_job = under_launcher() and int(os.environ.get("WORLD_SIZE", "1")) > 1
        sizes = collective_sizes(nproc, collective, in_job)
        check_sizes(sizes, nproc, oversubscribe)
        result = check_precision(
            dtype,
            world_size,
            algorithm,
            elements,
            seed,
            sizes=sizes,
            in_job=in_job,
            shadow_steps=shadow_steps,
        )
        if result is None:
            raise typer.Exit(ExitStatus.OK)  # rank 0 speaks for the job
        findings, extra = result
        if not as_json:
            _print_precision(dtype, algorithm, world_size, extra)
        emit(findings, as_json, extra=extra, title="check-precision")


def _print_precision(dtype: str, algorithm: str, world_size: int, extra: dict) -> None:
    audit = extra["reduction"]
    console.print(
        f"{dtype} {algorithm} reduction over {world_size} ranks: slope "
        f"{audit['slope']:.6f} (bias {audit['bias']:.2e}), noise {audit['noise']:.2e}",
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
