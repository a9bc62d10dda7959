"""`trainguard reference record RUN_DIR --out REF.json`: a finished run's curve, for comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console, emit, err_console


def record(run_dir: Path, out: Path, as_json: bool) -> None:
    """Record the curve of any run record to `out`, print and exit."""
    from trainguard.reference.record import record_reference, run_inputs
    from trainguard.util.atomic import check_writable
    from trainguard.util.paths import refuse_overwrite

    refuse_overwrite({"--out": out}, run_inputs(run_dir))  # before reading anything
    check_writable(out)
    skipped: list[str] = []
    try:
        curve, findings = record_reference(run_dir, skipped)
    finally:  # damaged log lines the curve was read without, said even when it fails
        for line in skipped:
            err_console.print(f"warning: {line}", markup=False, soft_wrap=True)
    curve.save(out)
    extra = {
        "out": str(out),
        "recipe_name": curve.recipe_name,
        **curve.summary(),
        "single_environment": curve.single_environment,
        "data_identity": curve.data_identity is not None,
    }
    if not as_json:
        console.print(
            f"wrote {out}: {len(curve.steps)} steps of {curve.recipe_name!r} (recipe hash "
            f"{curve.recipe_hash}), final loss {curve.loss[-1]:.4f}, noise "
            f"{curve.noise.sigma:.4f}"
            + ("" if curve.data_identity else "; no verified checkpoint: data not compared")
        )
    emit(findings, as_json, extra=extra, title="reference record")


def register(app: typer.Typer) -> None:
    reference = group(app, "reference")

    @reference.command("record")
    def reference_record(
        run_dir: Annotated[
            Path,
            typer.Argument(
                help="The run dir of a finished run: `trainguard run`'s, or any loop's run record."
            ),
        ],
        out: Annotated[Path, typer.Option("--out", help="The reference file to write (JSON).")],
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Record a finished run's training loss at each step (and its evaluations) with its
        recipe hash, environment and data identity. Name the file in a recipe
        (`reference.path`) and later runs of the same recipe are compared with it."""
        record(run_dir, out, as_json)
