"""Acting on what the guard knows, inside `trainguard run`'s loop, through the one guard protocol
(`Guard.settle`: the rerun that classifies a suspect step, then a rollback or a halt). The loop
settles every `Guard.judge` and `Guard.after_update` here, on the host path and the device path
alike; what it adds to the protocol is the run's record: the findings, the rollback's event
(with the positions of the bad batches, for `trainguard batch`), the callbacks' state kept
across the restore, and on the device path the step rows held until their values are read."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainguard.errors import RunHalted
from trainguard.guard.decision import Decision
from trainguard.guard.judgement import Judgement
from trainguard.train.saving import finish_checkpoint

if TYPE_CHECKING:
    from trainguard.train.device_steps import DeviceSteps
    from trainguard.train.loop import Loop


def recompute(loop: Loop) -> Callable[[int], tuple[Any, Any]]:
    """`rerun(step)` for `Guard.settle`: step `step` again from the same weights on the same
    batch (its loss and gradient norm, read on the host). The update stays unapplied either
    way: a corrupt first result is not to be trusted, and a reproducible bad one is exactly
    what the guard refused."""

    def rerun(step: int) -> tuple[Any, Any]:
        with loop.guard.phase("data", step):
            second = loop.math.forward_backward(step, loop.sampler.position(step))
        return second.loss, second.grad_norm

    return rerun


def settle(
    loop: Loop,
    what: Judgement | Decision | None,
    device: DeviceSteps | None = None,
    read_back: bool = True,
) -> bool:
    """Settle what the guard knows now (`Guard.settle`: its rerun first) and record it; roll
    back or halt. On the device path (`device`) a decision read back (`read_back`: not the
    replicas' alone) sends its step's held row to the callbacks. False when the loop rolled
    back (the step ends there)."""
    done = loop.guard.settle(what, rerun=recompute(loop), defer=True)
    decision = done.decision
    if decision is None:
        return True
    loop.ctx.record(decision.findings)
    if decision.action == "rollback":
        if device is not None:
            device.reset()
            pending = loop.guard.flush()  # a replica rollback: the step judged before it
            if pending is not None and not settle(loop, pending, device):
                return False  # that one rolled back already
        roll_back(loop, decision)
        return False
    if decision.action == "halt":
        if any(f.code == "H201" for f in decision.findings):
            raise replicas_halted(decision)
        decision.raise_if_halt()
    if device is not None and read_back:
        device.settled(decision)
    return True


def roll_back(loop: Loop, decision: Decision) -> None:
    """Return to the newest verified checkpoint through `Guard.rollback` (the guard acts on
    the decision it made: `decision` is its `pending_rollback`) and never read the bad steps'
    batches again. The guard's counters, the sampler's earlier skips and the callbacks' state
    outlive the restore (a rollback rewinds the model, not the run's history)."""
    ctx, sampler = loop.ctx, loop.sampler
    finish_checkpoint(loop)  # the newest checkpoint may still be on its way to disk
    kept = loop.callbacks.state_dict()
    # The batch each bad step read, by step (`trainguard batch --step N` finds it here); the
    # restore keeps the sampler's skips, so these are the positions as read.
    read_at = {s: sampler.position(s) for s in decision.bad_steps}
    before = {tuple(r) for r in sampler.skipped_positions}
    loop.guard.pending_rollback = decision
    to_step = loop.guard.rollback(loop.checkpointer, loop.state, sampler)  # RunHalted: none
    loop.callbacks.load_state_dict(kept)
    ctx.record(loop.checkpointer.last_findings)
    skipped = [r for r in sampler.skipped_positions if tuple(r) not in before]
    ctx.log_event(
        "rollback",
        from_step=decision.step,
        to_step=to_step,
        skipped_positions=skipped,
        bad_positions={str(s): pos for s, pos in read_at.items() if s >= to_step},
    )
    ctx.display.message(
        f"rollback: step {decision.step} -> checkpoint {to_step}, "
        f"skipping {len(skipped)} bad batches"
    )


def replicas_halted(end: Decision) -> RunHalted:
    """The replicas diverged more often than `guards.max_rollbacks` allows: a host, not data."""
    h201 = [f for f in end.findings if f.code == "H201"]
    last = h201[-1].message if h201 else "see the findings"
    return RunHalted(
        f"the replicas diverged again at step {end.step} (H201, R203): {last}",
        "drain the named hosts and restart; raise guards.max_rollbacks to retry more",
    )
