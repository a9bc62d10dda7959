"""The parts of `trainguard run`'s loop, wired (`compose`): the sampler, the guard with its
distributed part, the step's arithmetic, the callbacks in their order (the fire drills' faults
among them when a plan is active), and the state every checkpoint holds.
`train/guarded_run.py` builds the model and data first and restores into the result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.config.identity import recipe_hash
from trainguard.config.load import recipe_to_dict
from trainguard.data.sampler import ElasticSampler
from trainguard.data.shards import data_identity
from trainguard.faults import FaultPlan
from trainguard.findings import Finding
from trainguard.guard.core import Guard
from trainguard.guard.distributed.guards import DistributedGuards
from trainguard.reference.select import Selected
from trainguard.train import saving
from trainguard.train.callback import Callback, Callbacks, RunContext
from trainguard.train.callbacks.checkpoint import CheckpointCallback
from trainguard.train.callbacks.distributed_guards import DistributedGuardsCallback
from trainguard.train.callbacks.evals import EvalsCallback
from trainguard.train.callbacks.faults import FaultsCallback
from trainguard.train.callbacks.goodput import GoodputCallback
from trainguard.train.callbacks.preflight import PreflightCallback
from trainguard.train.callbacks.reference import ReferenceCallback
from trainguard.train.callbacks.resume import ResumeCallback
from trainguard.train.callbacks.steplog import StepLogCallback
from trainguard.train.callbacks.validation import ValidationCallback
from trainguard.train.callbacks.watchdog import WatchdogCallback
from trainguard.train.compute import StepMath
from trainguard.train.loop import Loop
from trainguard.train.world import Dist


@dataclass
class Composed:
    """The loop, and the callbacks the run itself talks to."""

    loop: Loop
    resume: ResumeCallback
    validation: ValidationCallback
    watchdog: WatchdogCallback | None


def compose(
    ctx: RunContext,
    dist: Dist,
    data: Any,  # data.prepare.PreparedData
    checkpointer: Checkpointer,
    *,
    faults: FaultPlan,
    evals: bool,
    env: dict[str, Any],
    reference: Selected | None,
    on_hang: Callable[[Finding], None],
    on_timeout: Callable[[Finding], None],
    extra: Sequence[Callback] = (),
) -> Composed:
    """Everything the loop is made of, around `ctx.model` and `ctx.optimizer`. `on_hang` and
    `on_timeout` run just before the process exits 3 for a restart (the hung-rank diagnosis,
    the hang watchdog); `reference`: the curve the run is compared with, if any; `faults`: the
    fire drill's plan (a `FaultsCallback` when active); `extra`: more callbacks beside the
    run's own (the user's among them)."""
    r, t, world = ctx.recipe, ctx.recipe.train, dist.world
    global_batch = t.batch_size * t.grad_accum  # sequences per optimizer step (the full batch)
    sampler = ElasticSampler(
        data.train.num_samples(r.data.seq_len),
        # A ramp (train.batch_ramp) reaches the full batch; the micro-batch stays the same.
        global_batch_size=t.batch_ramp or global_batch,
        seed=t.seed,
        rank=world.rank,
        world_size=world.size,
        micro_batch_size=t.batch_size // world.size,
    )
    part = DistributedGuards(
        dist.config,
        run_dir=ctx.run_dir,
        max_rollbacks=r.guards.max_rollbacks,
        group=dist.group,
        on_hang=on_hang,
        agree_metrics=False,  # the trainer all-reduces the loss (and DDP the gradients)
    )
    # One epoch of the data order, in steps: the period a poor shuffle would show. The guard
    # owns the distributed part, so that the part's state is saved and survives rollbacks.
    guard = Guard(config=r.guards, data_period=sampler.num_samples / global_batch, distributed=part)
    math = StepMath(
        r,
        ctx.model,
        ctx.optimizer,
        data.train,
        data.val,
        sampler,
        world=world,
        device=ctx.device,
        # DDP (several processes) broadcasts rank 0's initial weights; None for one process.
        ddp_model=dist.wrap(ctx.model, t.precision),
        on_phase=ctx.set_phase,
    )
    resume = ResumeCallback(env)
    validation = ValidationCallback(math, _offtrack(r))
    checkpoints = CheckpointCallback()
    found: list[Callback] = [StepLogCallback(), resume, DistributedGuardsCallback(part), validation]
    found.append(GoodputCallback(checkpointer))  # the timing rows of goodput accounting
    found.append(checkpoints)
    if r.preflight.enabled:
        found.append(PreflightCallback(data, evals))
    watchdog = None
    if r.guards.enabled:
        rank = world.rank if world.size > 1 else None
        watchdog = WatchdogCallback(ctx.run_dir, r.guards, rank, on_timeout)
        found.append(watchdog)
    if reference is not None:  # the comparison with a reference curve (R501-R507)
        identity = data_identity(data.manifest)
        found.append(ReferenceCallback(reference, env, identity, r.reference))
    if evals:
        from trainguard.evals.schedule import EvalSchedule

        schedule = EvalSchedule(r.evals, data.tokenizer, r.data, t.eval_interval, ctx.device)
        found.append(EvalsCallback(schedule))
    writing: list = []  # the Loop's: the checkpoints being written in the background
    if faults.active:  # fire drills and crash tests (TRAINGUARD_INJECT)
        settle = lambda: writing[-1][1].wait() if writing else None  # noqa: E731
        found.append(FaultsCallback(faults, sampler.position, settle, checkpointer.wait_copied))
    callbacks = Callbacks([*found, *extra])
    ctx.phase_listener = callbacks.on_phase
    if callbacks.hears_loss:  # nothing is called per micro-batch unless a callback listens
        math.on_loss = lambda step, loss: callbacks.on_loss(ctx, step, loss)
    state = {
        "model": ctx.model,
        "optimizer": ctx.optimizer,
        "sampler": sampler,
        "run": ctx.progress,
        "guard": guard,
        "callbacks": callbacks,
    }
    recipe = recipe_to_dict(r)
    # In every manifest: what the step was trained on and with (D104, H101, R620 read it).
    meta = {
        "data_identity": data_identity(data.manifest),
        "recipe": recipe,
        "recipe_hash": recipe_hash(recipe),
        "env": env,
    }
    loop = Loop(ctx, math, sampler, guard, checkpointer, callbacks, state, meta, writing)
    checkpoints.save = lambda step: saving.save_checkpoint(loop, step)
    return Composed(loop, resume, validation, watchdog)


def _offtrack(recipe: Any) -> Any:
    """The off-track alarm of the recipe's prediction band (`prediction.band`), or None."""
    if not recipe.prediction.band:
        return None
    from trainguard.scaling.offtrack import OffTrackMonitor, PredictionBand

    p = recipe.prediction
    return OffTrackMonitor(PredictionBand.load(p.band), margin=p.margin, patience=p.patience)
