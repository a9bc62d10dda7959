"""Rollback in any loop: restore the last verified checkpoint, skip the bad steps' samples.

`Guard.rollback(checkpointer, state, sampler)` calls `restore` with itself. The order matters
and mirrors `trainguard run` (train/actions.py):

1. Before the restore, keep what must outlive it: the guard's action counters (its rollback
   count, or `max_rollbacks` could never halt; the distributed part's replica rollback count)
   and the sampler's recorded skips (the checkpoint predates the newest ones).
2. `checkpointer.load_latest(state)` restores every object in `state` in place (the guard and
   the sampler among them, if the loop checkpoints them) and returns n, the completed steps.
3. The guard takes the checkpoint's detector windows but keeps its counters; the sampler takes
   its skips back and records the bad steps at or after n (earlier ones are already in the
   restored past). Step n then reads the next unskipped global batch.
"""

from __future__ import annotations

from typing import Any, Protocol

from trainguard.errors import NoUsableCheckpoint, RunHalted
from trainguard.findings import Finding


class _Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RestorableGuard(_Stateful, Protocol):
    def after_rollback(self, checkpoint_state: dict[str, Any] | None) -> None: ...


class SkippingSampler(_Stateful, Protocol):
    def skip(self, steps: list[int]) -> list[list[int]]: ...


class Checkpointer(Protocol):
    def load_latest(self, state: dict[str, Any]) -> int | None: ...


def restore(
    guard: RestorableGuard,
    checkpointer: Checkpointer,
    state: dict[str, Any],
    sampler: SkippingSampler,
    bad_steps: list[int],
    at_step: int,
) -> tuple[int, dict[str, Any]]:
    """Restore, keep the counters and skips, skip the bad steps. Returns the step to continue
    from and the event to log (`from_step`, `to_step`, the skipped steps and positions)."""
    counters = guard.state_dict()
    skips = sampler.state_dict()
    try:
        step = checkpointer.load_latest(state)
    except NoUsableCheckpoint as e:  # checkpoints exist, none loads (C107)
        raise no_checkpoint(at_step, e.message) from None
    if step is None:
        raise no_checkpoint(at_step)
    restored = guard.state_dict()  # the checkpoint's, if the guard is in `state`
    guard.load_state_dict(counters)
    guard.after_rollback(restored)
    sampler.load_state_dict(skips)
    later = sorted({s for s in bad_steps if s >= step})
    positions = sampler.skip(later)
    event = {
        "event": "rollback",
        "from_step": at_step,
        "to_step": step,
        "skipped_steps": later,
        "skipped_positions": positions,
    }
    return step, event


def no_checkpoint(at_step: int, why: str | None = None) -> RunHalted:
    """The one text for a rollback with nowhere to go, in every loop."""
    return RunHalted(
        f"the guard asked for a rollback at step {at_step} but there is no valid checkpoint "
        f"to return to{f' ({why})' if why else ''}",
        "save checkpoints more often (trainguard run: a lower checkpoint.interval) so that a "
        "good state is on disk, or lower the learning rate",
    )


def checkpointer_findings(checkpointer: Any) -> list[Finding]:
    """The restore's findings (fallbacks past corrupt checkpoints, quarantines), if any."""
    return list(getattr(checkpointer, "last_findings", None) or [])


def rollback(guard: Any, checkpointer: Any, state: dict[str, Any], sampler: Any) -> int:
    """`Guard.rollback`: `restore` on the guard's pending rollback decision (under the
    checkpoint's timeout budget with several ranks), the event and the restore's findings
    recorded. Returns the step to continue from."""
    decision = guard.pending_rollback
    guard.pending_rollback = None
    at = decision.step if decision is not None else -1
    bad = decision.bad_steps if decision is not None else []
    if guard.distributed is None:
        step, event = restore(guard, checkpointer, state, sampler, bad, at)
    else:  # the load's collectives get the checkpoint budget, not the step timeout
        with guard.distributed.budget("checkpoint"):
            step, event = restore(guard, checkpointer, state, sampler, bad, at)
    for log in (guard._findings_log, guard.timing):  # the auditable record of the skips
        if log is not None:
            log.write({"kind": "event", "step": at, **event})
    guard.report(checkpointer_findings(checkpointer))
    return step
