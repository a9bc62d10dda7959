"""RUN_DIR/recipe.yaml, RUN_DIR/tokenizer.json and the run record's RUN_DIR/run.json
(`metrics/record.py`: the environment, the recipe, the data order, the checkpoints), written
once pre-flight has passed.

Every check that can refuse a run comes before its first write (`Run.setup`); pre-flight, the
last, runs in `pre_train`. Its verdict is logged (findings, report), but a resume it stops keeps
the recipe.yaml of the run it did not extend: with the new `train.max_steps` written there, the
finished run would read as unfinished (`reference record`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.checkpoint.target import run_checkpoint_root
from trainguard.data.sampler import ElasticSampler
from trainguard.metrics.record import SCHEMA_VERSION, write_run_info
from trainguard.train.callback import Callback, RunContext
from trainguard.train.rundir import write_recipe
from trainguard.util.atomic import atomic_copy

# The step rows' numbering this loop writes, in run.json: its rows count steps from 0 as every
# loop's do (schema 2); a run dir without run.json is an earlier release's, read converted.
ROWS_SCHEMA = SCHEMA_VERSION


class RunFilesCallback(Callback):
    name = "runfiles"
    priority = 95  # right after pre-flight (100), before anything else of pre_train

    def __init__(
        self, recipe: dict[str, Any], tokenizer_path: Path, num_samples: int | None = None
    ) -> None:
        self.recipe = recipe
        self.tokenizer_path = tokenizer_path
        self.num_samples = num_samples  # of the train split: the sampler's identity in run.json

    def pre_train(self, ctx: RunContext) -> None:
        if ctx.is_main:
            write_recipe(ctx.run_dir, self.recipe)
            # A whole-file replace: a link there is refused, its target never overwritten.
            atomic_copy(self.tokenizer_path, ctx.run_dir / "tokenizer.json")
            write_run_info(
                ctx.run_dir,
                loop="trainguard run",
                config=self.recipe,
                sampler=self._order(ctx),
                checkpoints={"root": run_checkpoint_root(ctx.run_dir), "layout": "checkpointer"},
                schema_version=ROWS_SCHEMA,
            )

    def _order(self, ctx: RunContext) -> ElasticSampler | None:
        """The run's data order as one process reads it (its identity: seed, size, batches)."""
        if self.num_samples is None:
            return None
        t = ctx.recipe.train
        batches = t.batch_ramp or t.batch_size * t.grad_accum
        return ElasticSampler(
            self.num_samples, global_batch_size=batches, seed=t.seed, rank=0, world_size=1
        )
