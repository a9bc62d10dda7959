"""Which checkpoints to delete and which to quarantine: keep the newest `keep` valid ones, never
the newest valid one, and never delete a step that failed verification.

A pure function, so the rule is tested apart from any file system. Validity here is the cheap
structural check (manifest intact, every file present with the right size) plus whatever the
store learned when loading (a checksum mismatch, a file that does not load); the full checksum
check runs when a checkpoint is written and when it is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainguard.checkpoint.failures import describe
from trainguard.checkpoint.local import QUARANTINE
from trainguard.checkpoint.manifest import step_dirname
from trainguard.findings import Finding, has_errors

if TYPE_CHECKING:
    from trainguard.checkpoint.local import LocalBackend
    from trainguard.checkpoint.remote import RemoteBackend

    Backend = LocalBackend | RemoteBackend


@dataclass(frozen=True)
class RetentionPlan:
    """`delete`: valid steps beyond `keep`, and uploads that were never committed (no manifest)
    older than the newest valid step. `quarantine`: steps that failed verification, moved to
    `quarantine/` as evidence, never deleted."""

    delete: list[int] = field(default_factory=list)
    quarantine: list[int] = field(default_factory=list)


def plan_retention(
    status: dict[int, bool],
    keep: int,
    protect: frozenset[int] = frozenset(),
    partial: frozenset[int] = frozenset(),
) -> RetentionPlan:
    """What to do with each step, given {step: valid} for every step folder.

    - the newest `keep` valid steps stay; older valid steps are deleted;
    - the newest valid step always stays, whatever `keep` says (keep >= 1 is enforced);
    - invalid steps are quarantined, older or newer than the valid ones: they are never loaded,
      and the evidence of what damaged them is kept;
    - `partial` steps (an object-store upload killed before its manifest, the analogue of a
      local temp folder) are deleted once a newer valid step exists;
    - steps in `protect` (the one just written) stay;
    - with no valid step at all nothing is touched.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    valid = sorted((s for s, ok in status.items() if ok and s not in partial), reverse=True)
    if not valid:
        return RetentionPlan()
    kept = set(valid[:keep]) | set(protect)
    newest_valid = valid[0]
    delete = [
        s for s in status if s not in kept and (s in valid or (s in partial and s < newest_valid))
    ]
    quarantine = [s for s, ok in status.items() if not ok and s not in partial | kept]
    return RetentionPlan(sorted(delete), sorted(quarantine))


def quarantine(backend: Backend, step: int, problems: list[Finding]) -> Finding:
    """Move a step that failed verification to `quarantine/` (C112); never delete it."""
    where = backend.move_aside(step, f"{QUARANTINE}/{step_dirname(step)}")
    why = "; ".join(f.message for f in problems if f.severity == "error") or "invalid"
    return Finding.of(
        "C112",
        f"checkpoint step {step} failed verification ({why}); moved to {where} instead of "
        "deleting it",
        step=step,
        where=where,
        data={"problems": [f.code for f in problems if f.severity == "error"]},
    )


def displace(backend: Backend, step: int, rejected: dict[int, list[Finding]]) -> list[Finding]:
    """Before step `step` is written again: quarantine the old one if it failed verification
    (replacing it would destroy the evidence). A valid one is replaced as before (a step saved
    again after a rollback). `rejected` holds what loading found; it is updated."""
    if not backend.has_step(step):
        return []
    problems = rejected.pop(step, None) or backend.verify(step)
    return [quarantine(backend, step, problems)] if has_errors(problems) else []


def apply_retention(
    backend: Backend,
    status: dict[int, tuple[bool, bool]],
    keep: int,
    protect: int,
    rejected: dict[int, list[Finding]],
) -> tuple[list[int], list[Finding]]:
    """Carry out `plan_retention` after a save of step `protect`: (deleted steps, findings).
    `status` is {step: (committed, structurally valid)}; steps in `rejected` (they failed a
    full verification or did not load) count as invalid. Never raises: a save that succeeded
    must not fail because of retention."""
    for s in rejected:
        if s in status and s != protect:
            status[s] = (status[s][0], False)
    partial = {s for s, (committed, _) in status.items() if not committed}
    plan = plan_retention(
        {s: ok for s, (_, ok) in status.items()},
        keep,
        frozenset({protect}),
        frozenset(partial) if backend.remote else frozenset(),
    )
    deleted, findings = [], []
    for s in plan.quarantine:
        try:
            findings.append(
                quarantine(backend, s, rejected.get(s) or backend.verify(s, full=False))
            )
            rejected.pop(s, None)  # only once moved: a step left in place stays rejected
        except Exception as e:
            findings.append(_failed(backend, s, "move to quarantine", e))
    for s in plan.delete:
        try:
            backend.delete(s)
            deleted.append(s)
            if backend.remote and s in partial:
                findings.append(
                    Finding.of(
                        "C204",
                        f"deleted partial upload of step {s} (objects but no manifest)",
                        step=s,
                        where=backend.location(s),
                    )
                )
        except Exception as e:
            findings.append(_failed(backend, s, "delete", e))
    return deleted, findings


def _failed(backend: Backend, step: int, action: str, exc: BaseException) -> Finding:
    return Finding.of(
        "C201" if backend.remote else "C106",
        f"retention could not {action} step {step}: {describe(exc)}",
        severity="warning",
        step=step,
        where=backend.location(step),
    )
