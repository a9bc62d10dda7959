"""The spine of `trainguard run`: the training loop, and one step read top to bottom.

The loop is composed of the public parts (`ElasticSampler`, `Guard` with its distributed part,
`Checkpointer`) and the arithmetic of `train/compute.py`; everything else is a callback
(`train/callback.py`) told at fixed points. `train_step` is the whole story of a step: data,
forward/backward, the guard's judgement before any weight changes, the callbacks' veto, apply
or discard, the replica check, the step row, the callbacks (the checkpoint among them). `step`
is the 0-based index of the step being computed everywhere (the sampler's, the guard's, the
callbacks', the fault plan's, the row's); a checkpoint holds completed steps: after step s,
`save(s + 1)`.
"""

from __future__ import annotations

import time

from trainguard.guard.detectors.moe import router_summary
from trainguard.train.actions import settle
from trainguard.train.device_steps import DeviceSteps
from trainguard.train.loop import Loop
from trainguard.train.saving import checkpoint_due, finish_checkpoint


def train(loop: Loop) -> None:
    """Train from the restored step to `train.max_steps`. Every callback hears of an error
    (`on_error`) before it is raised; closing them is the caller's (always, also when a step
    before this one failed)."""
    ctx, callbacks = loop.ctx, loop.callbacks
    # The guard decides on the device (no host sync in a step) on CUDA, or when asked.
    on_device = DeviceSteps(loop) if loop.guard.on_device(ctx.device) else None
    try:
        # The order the callbacks run in, for the log and the reader of the display.
        ctx.log_event("callbacks", order=callbacks.order())
        ctx.display.message("callbacks: " + " > ".join(callbacks.order()))
        callbacks.pre_train(ctx)
        while ctx.step < ctx.recipe.train.max_steps:
            train_step(loop, on_device)
        finish_checkpoint(loop)  # the end waits for the last write
        callbacks.post_train(ctx)
    except BaseException as e:
        callbacks.on_error(ctx, e)
        raise


def train_step(loop: Loop, on_device: DeviceSteps | None = None) -> None:
    """One optimizer step. A rollback ends it early: the next call continues from the restored
    step. A halt raises RunHalted. With `on_device` the guard judges on the device and this
    step's decision, findings and row come one step later (or before a checkpoint or an
    evaluation, which read it back first)."""
    ctx, guard, math = loop.ctx, loop.guard, loop.math
    step = ctx.step  # the 0-based index of the step computed now (= completed steps)
    t = ctx.recipe.train
    # A checkpoint of step + 1 completed steps follows (`CheckpointCallback`): the replicas are
    # compared first, so that no corrupt one is saved.
    saves = checkpoint_due(ctx.recipe, step + 1)
    loop.callbacks.pre_step(ctx, step)

    # -- data: where this step's global batch starts (bad batches of rollbacks skipped) -------
    position = loop.sampler.position(step)
    tokens = loop.step_tokens(step)
    t0 = time.perf_counter()

    # -- forward/backward over grad_accum micro-batches, gradients all-reduced (DDP) ------------
    # A collective that fails in here (a rank died, or hangs) becomes the hung-rank diagnosis:
    # the ranks that did not arrive are named, stacks dumped, exit 3 for a restart (R301).
    with guard.phase("data", step):
        # Host sync (host path only): the loss and grad norm. The device path reads nothing.
        out = math.forward_backward(step, position, on_host=on_device is None)
    compute_s = time.perf_counter() - t0  # forward/backward, the data phase included
    # The previous step's checkpoint copied the weights and the optimizer state beside this
    # forward/backward (`background_copy`): nothing below may change them before it is done.
    loop.checkpointer.wait_copied()

    # -- the guard judges the update before any weight changes (`Guard.judge`) and the loop ----
    # -- settles what it knows (`Guard.settle`: rerun, rollback, halt) -------------------------
    # The host path knows this step's decision now; the device path masks this step's update
    # on the device and knows the previous step's, read back here (no host sync in the step).
    if on_device is None:
        tokens_per_s, step_time_s, router = tokens / compute_s, compute_s, out.router_stats
    else:
        tokens_per_s = on_device.tokens_per_s(tokens, t0)
        step_time_s, router = on_device.interval, on_device.router_reader(out)
    judgement = guard.judge(
        step,
        loss=out.loss,
        grad_norm=out.grad_norm,
        model=ctx.model,
        on_host=on_device is None,
        tokens_per_s=tokens_per_s,
        router_stats=router,  # R601-R604 (MoE models)
        data_time_s=out.data_time_s,  # R605: the loader's share of the step
        step_time_s=step_time_s,
    )
    if not settle(loop, judgement, on_device):
        return  # rolled back: the next call continues from the restored step
    decision = judgement.decision  # None on the device path: settled a step later

    # -- the callbacks may veto the update; then it is applied, skipped or masked as judged -----
    applies = decision is None or decision.apply  # the device path: masked on the device
    vetoed = loop.callbacks.pre_optimizer_step(ctx, step, decision) if applies else None
    if applies and vetoed is None:
        lr = math.apply_update(step, judgement)  # `judgement.optimizer_step`
    else:  # skipped by the guard, or vetoed: the gradients go, the weights stay
        math.discard_update()
        lr = 0.0
    action = "veto" if vetoed is not None else decision.action if decision is not None else None
    loop.callbacks.post_optimizer_step(ctx, step)

    # -- after the update (`Guard.after_update`): replicas (H201 rolls back) and stragglers ------
    # Host sync with several processes: every rank's parameter hash (every K steps, and before
    # a checkpoint, so that no corrupt replica is saved) and phase timings, then a monitored
    # barrier. Before a checkpoint or a validation loss the device path reads this step back.
    evaluates = (step + 1) % t.eval_interval == 0
    due = saves or (on_device is not None and evaluates)
    reads_back = due and guard.pending_step is not None  # this step's decision comes with it
    end = guard.after_update(step, ctx.model, ctx.optimizer, checkpoint_due=due)
    if not settle(loop, end, on_device, read_back=reads_back):
        return

    # -- the step is done: advance, log it, tell the callbacks (evaluations among them) --------
    ctx.progress.advance(tokens)
    dt = time.perf_counter() - t0
    row = {
        "kind": "step",
        "step": step,
        "loss": out.loss,
        "grad_norm": out.grad_norm,
        "lr": lr,
        "tokens_per_s": tokens / dt if on_device is None else tokens_per_s,
        "batch_hash": out.batch_hash,
        "position": out.position,  # the batch of this row: `trainguard batch --step`
        "step_time_s": dt,
        "data_time_s": out.data_time_s,
        **(router_summary(out.router_stats) if out.router_stats else {}),
        "time": time.time(),
        "action": action,
        **({"vetoed_by": vetoed} if vetoed is not None else {}),
    }
    # The callbacks, in order: the row to the log, the evaluations, and last the checkpoint when
    # due (`CheckpointCallback`: step + 1 completed steps, saved in the background).
    if on_device is None:
        loop.callbacks.post_step(ctx, step, row)
    else:  # the row waits for its values (read back already before a checkpoint or an eval)
        on_device.hold(step, row)
