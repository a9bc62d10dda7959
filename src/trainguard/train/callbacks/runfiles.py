"""RUN_DIR/recipe.yaml and RUN_DIR/tokenizer.json, written once pre-flight has passed.

Every check that can refuse a run comes before its first write (`Run.setup`); pre-flight, the
last, runs in `pre_train`. Its verdict is logged (findings, report), but a resume it stops keeps
the recipe.yaml of the run it did not extend: with the new `train.max_steps` written there, the
finished run would read as unfinished (`reference record`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.train.callback import Callback, RunContext
from trainguard.train.rundir import write_recipe
from trainguard.util.atomic import atomic_copy


class RunFilesCallback(Callback):
    name = "runfiles"
    priority = 95  # right after pre-flight (100), before anything else of pre_train

    def __init__(self, recipe: dict[str, Any], tokenizer_path: Path) -> None:
        self.recipe = recipe
        self.tokenizer_path = tokenizer_path

    def pre_train(self, ctx: RunContext) -> None:
        if ctx.is_main:
            write_recipe(ctx.run_dir, self.recipe)
            # A whole-file replace: a link there is refused, its target never overwritten.
            atomic_copy(self.tokenizer_path, ctx.run_dir / "tokenizer.json")
