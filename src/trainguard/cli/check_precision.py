"""`trainguard check-precision [--dtype fp32|bf16|fp16] [--world-size R]
[--algorithm ring|tree|fp32-accumulate] [--json]`: is the gradient reduction biased?"""

from __future__ import annotations

from typing import Annotated

import typer

from trainguard.cli.common import console, emit, handle_errors
from trainguard.config.schema import SEED_MAX


def register(app: typer.Typer) -> None:
    @app.command("check-precision")
    @handle_errors
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
                "local processes, and DDP with fp32_accumulate_hook."
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
        from trainguard.checks.precision_reduction import check_reduction
        from trainguard.checks.precision_shadow import check_shadow

        findings, audit = check_reduction(dtype, world_size, algorithm, elements, seed)
        extra: dict = {"reduction": audit.to_dict()}
        if collective:
            from trainguard.checks.precision_collective import check_collective

            f_coll, audits = check_collective(dtype, (2, 4), elements, seed)
            findings += f_coll
            extra["collective"] = [a.to_dict() for a in audits]
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
                    f"gloo world {a['world_size']} {a['algorithm']}: bias {a['bias']:.2e}, "
                    f"noise {a['noise']:.2e}",
                    markup=False,
                )
            for name, s in extra.get("shadow", {}).items():
                console.print(
                    f"shadow run ({name} rounding): error grows like steps^{s['exponent']:.2f}",
                    markup=False,
                )
        emit(findings, as_json, extra=extra, title="check-precision")
