"""`trainguard checkpoint convert RUN_DIR`: an earlier release's run checkpoints in the one
format (train/convert_checkpoints.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console


def register(app: typer.Typer) -> None:
    checkpoint = group(app, "checkpoint")

    @checkpoint.command("convert")
    def convert(
        run_dir: Annotated[Path, typer.Argument(help="The run dir of a `trainguard run`.")],
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Rewrite the run dir's checkpoints written by an earlier release (model.safetensors,
        trainer.json, ...) in the format every loop gets, so `trainguard run` resumes them
        bitwise. The old step folders move to the checkpoint folder's attic/ (nothing is
        deleted); each new one is verified."""
        from trainguard.train.convert_checkpoints import convert_run_dir

        done = convert_run_dir(run_dir)
        doc = {
            "converted": done.steps,
            "attic": str(done.attic) if done.attic else None,
            "left": {str(k): v for k, v in done.left.items()},
        }
        if as_json:
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
            return
        if not done.steps:
            console.print(
                f"{run_dir}: no checkpoint of the earlier format to convert",
                markup=False,
                soft_wrap=True,
            )
        else:
            steps = ", ".join(str(s) for s in done.steps)
            console.print(
                f"converted steps {steps}; the old folders are in {done.attic}",
                markup=False,
                soft_wrap=True,
            )
        for step, why in sorted(done.left.items()):
            console.print(f"step {step} left as it was: {why}", markup=False, soft_wrap=True)
