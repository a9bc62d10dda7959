"""The spine of `trainguard run`: the training loop, and one step read top to bottom.

The loop is composed of the public parts (`ElasticSampler`, `Guard` with its distributed part,
`Checkpointer`) and the arithmetic of `train/compute.py`; everything else is a callback
(`train/callback.py`) told at fixed points. `train_step` is the whole story of a step: data,
forward/backward, the guard's judgement before any weight changes, the callbacks' veto, apply
or discard, the replica check, the step row, the callbacks, the checkpoint. `step` is the
0-based index of the step being computed everywhere (the sampler's, the guard's, the callbacks',
the fault plan's, the row's); a checkpoint holds completed steps: after step s, `save(s + 1)`.
"""

from __future__ import annotations

import time

from trainguard.guard.detectors.moe import router_summary
from trainguard.train.actions import replicas_halted, rerun, roll_back
from trainguard.train.device_steps import DeviceSteps
from trainguard.train.loop import Loop
from trainguard.train.saving import checkpoint_due, finish_checkpoint, save_checkpoint


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
    step's decision, findings and row come one step later (or at a flush)."""
    ctx, guard, math = loop.ctx, loop.guard, loop.math
    step = ctx.step  # the 0-based index of the step computed now (= completed steps)
    t = ctx.recipe.train
    saves = checkpoint_due(ctx.recipe, step + 1)  # a checkpoint of step + 1 completed steps
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

    # -- the guard judges the update before any weight changes; the callbacks may veto it; ------
    # -- apply or discard it ---------------------------------------------------------------------
    vetoed: str | None = None
    if on_device is None:
        tokens_per_s = tokens / compute_s
        decision = guard.step(
            step,
            loss=out.loss,
            grad_norm=out.grad_norm,
            tokens_per_s=tokens_per_s,
            router_stats=out.router_stats,  # R601-R604 (MoE models)
            data_time_s=out.data_time_s,  # R605: the loader's share of the step
            step_time_s=compute_s,
        )
        if decision.rerun:  # the same state and batch again: hardware, or data/software?
            rerun(loop, decision, out, position)
        ctx.record(decision.findings)
        if decision.action == "rollback":
            roll_back(loop, decision)
            return
        decision.raise_if_halt()
        if decision.apply:
            vetoed = loop.callbacks.pre_optimizer_step(ctx, step, decision)
        if decision.apply and vetoed is None:
            lr = math.apply_update(step)
        else:
            math.discard_update()
            lr = 0.0
        action: str | None = decision.action if vetoed is None else "veto"
    else:  # masked on the device; the previous step's decision is settled (read back) here
        tokens_per_s = on_device.tokens_per_s(tokens, t0)
        pending = on_device.judge(step, out, tokens_per_s)
        if pending is None:
            return  # the previous step rolled back
        vetoed = loop.callbacks.pre_optimizer_step(ctx, step, None)
        if vetoed is None:
            lr = math.apply_update(step, pending)
        else:  # the device's mask is moot: nothing is applied
            math.discard_update()
            lr = 0.0
        action = None if vetoed is None else "veto"  # else known when read back
    loop.callbacks.post_optimizer_step(ctx, step)

    # -- replicas and stragglers (several processes): H201 rolls back, H202 is reported -------
    # Host sync: every rank's parameter hash (every K steps, and before a checkpoint, so that
    # no corrupt replica is saved) and phase timings are gathered, then a monitored barrier.
    end = guard.end_step(step, ctx.model, ctx.optimizer, checkpoint_due=saves)
    ctx.record(end.findings)
    if end.action == "halt":
        raise replicas_halted(end)
    if end.action == "rollback":
        if on_device is not None and not on_device.flush():  # rollback reads a settled guard
            return
        roll_back(loop, end)
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
    if on_device is None:
        loop.callbacks.post_step(ctx, step, row)
    else:  # the row waits for its values; a checkpoint or a validation loss waits for it
        on_device.hold(step, row)
        if (saves or (step + 1) % t.eval_interval == 0) and not on_device.flush():
            return  # this step rolled back

    # -- checkpoint when due: step + 1 completed steps -------------------------------------------
    if saves:
        save_checkpoint(loop, step)
