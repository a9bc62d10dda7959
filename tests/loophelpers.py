"""`trainguard run`'s loop in-process, from real parts (torchtitan style: no subprocess): the
run's checkpoint state, a narrow context, and a `Loop` whose checkpointer is a real
`Checkpointer` (the format every loop gets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainguard import ElasticSampler, Guard
from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.config.load import validate_recipe
from trainguard.metrics.sinks import open_run_sinks
from trainguard.train.callback import Callback, Callbacks, RunContext
from trainguard.train.progress import ProgressDisplay
from trainguard.train.run_state import RunState
from trainguard.train.spine import Loop
from trainguard.train.world import World

TINY = {
    "model": {"n_layers": 1, "d_model": 16, "n_heads": 2},
    "data": {"seq_len": 8},
    "train": {"optimizer": "adamw", "max_steps": 100},
}


def run_state(
    model: torch.nn.Module,
    optimizer: Any,
    sampler: ElasticSampler,
    *,
    progress: RunState | None = None,
    guard: Guard | None = None,
    callbacks: Callbacks | None = None,
) -> dict[str, Any]:
    """The state dict every run checkpoint holds (train/run_state.py)."""
    return {
        "model": model,
        "optimizer": optimizer,
        "sampler": sampler,
        "run": progress or RunState(),
        "guard": guard or Guard(),
        "callbacks": callbacks or Callbacks([]),
    }


def run_checkpointer(root: Path, keep: int = 10) -> Checkpointer:
    return Checkpointer(str(root), keep=keep)


def context(run_dir: Path, model: torch.nn.Module, optimizer: Any, **recipe: Any) -> RunContext:
    """A real context: the tiny recipe (with `recipe` sections merged in), metrics.jsonl in
    `run_dir`, no progress output."""
    raw = {k: {**TINY.get(k, {}), **recipe.get(k, {})} for k in {*TINY, *recipe}}
    r = validate_recipe(raw)
    return RunContext(
        r,
        run_dir,
        World(),
        torch.device("cpu"),
        metrics=open_run_sinks(run_dir, r.metrics),
        display=ProgressDisplay(r.train.max_steps, r.train.log_interval, enabled=False),
        progress=RunState(),
        model=model,
        optimizer=optimizer,
    )


def loop_without_data(
    tmp_path: Path,
    *,
    num_samples: int,
    global_batch: int,
    callbacks: list[Callback] = (),
    guard: Guard | None = None,
) -> Loop:
    """A loop over a linear model for what needs no forward pass: checkpoints, rollbacks,
    callback state. `train_step` needs a StepMath (see `tiny_run`)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx = context(tmp_path / "run", model, optimizer)
    sampler = ElasticSampler(num_samples, global_batch_size=global_batch, seed=7)
    cbs = Callbacks(callbacks)
    ctx.phase_listener = cbs.on_phase
    guard = guard or Guard()
    state = run_state(model, optimizer, sampler, progress=ctx.progress, guard=guard, callbacks=cbs)
    checkpointer = run_checkpointer(tmp_path / "ckpt")
    return Loop(ctx, None, sampler, guard, checkpointer, cbs, state)  # type: ignore[arg-type]
