"""Acting on the guard's decisions inside `trainguard run`'s loop: rerun a suspect step to
classify it, roll back to the newest verified checkpoint, halt when the replicas keep diverging.
Both loops call these: the host path (`train/spine.py`) at once, the device path
(`train/device_steps.py`) when a decision is read back a step later."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.errors import RunHalted
from trainguard.guard.decision import Decision
from trainguard.train.compute import StepResult
from trainguard.train.saving import finish_checkpoint

if TYPE_CHECKING:
    from trainguard.train.loop import Loop


def rerun(loop: Loop, decision: Decision, first: StepResult, position: int) -> None:
    """Recompute the suspect step from the same state and batch; say hardware or software.
    The update stays unapplied either way: a corrupt first result is not to be trusted, and a
    reproducible bad one is exactly what the guard refused."""
    with loop.guard.phase("data", decision.step):
        second = loop.math.forward_backward(decision.step, position)
    verdict = loop.guard.classify_rerun(
        (first.loss, first.grad_norm), (second.loss, second.grad_norm), step=decision.step
    )
    decision.findings.append(verdict)
    loop.math.discard_update()


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
    loop.guard.pending_rollback = decision  # the same one, unless the device path read it back
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
