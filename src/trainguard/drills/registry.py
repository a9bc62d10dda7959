"""What a drill is: the `Drill` record, the table `DRILLS` its `@drill` decorator fills, and the
two shapes most drills take (`guarded_drill`: the guard catches the fault in one process;
`relaunch_drill`: the fault ends the process and a relaunch resumes), with the readers of a
run's outcome they share. The scenario modules build on these; `scenarios.py` holds the table
with every drill registered.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

from trainguard.drills.matrix import DrillRow
from trainguard.drills.runner import DrillContext, RunOutcome


@dataclass(frozen=True)
class Drill:
    name: str
    fault: str
    fn: Callable[[DrillContext], DrillRow]
    processes: int = 1
    """Local processes the drill runs at once (`trainguard run --nproc N`: N)."""

    def run(self, ctx: DrillContext) -> DrillRow:
        try:
            row = self.fn(ctx)
        except Exception as e:  # a broken drill is a failed row, not a crashed command
            row = DrillRow(self.name, self.fault, [], note=f"drill crashed: {e!r}")
        row.name, row.fault = self.name, self.fault
        return row


DRILLS: dict[str, Drill] = {}


def drill(
    name: str, fault: str, processes: int = 1
) -> Callable[[Callable[[DrillContext], DrillRow]], Drill]:
    """Register a drill under `name`; the table shows `fault` as its first column. A drill of
    several local processes says how many (`drill` counts them against the cores)."""

    def register(fn: Callable[[DrillContext], DrillRow]) -> Drill:
        DRILLS[name] = Drill(name, fault, fn, processes)
        return DRILLS[name]

    return register


# --- reading a run's outcome --------------------------------------------------------------------
def present(out: RunOutcome, codes: tuple[str, ...] | list[str]) -> list[str]:
    """The codes among `codes` that `out` reported, in order of first appearance."""
    seen: list[str] = []
    for c in out.codes():
        if c in codes and c not in seen:
            seen.append(c)
    return seen


def actions_taken(out: RunOutcome) -> tuple[str, int]:
    """A summary of the guard's actions, and the steps of work they threw away."""
    codes = out.codes()
    parts, lost = [], 0
    if (n := codes.count("R201")) > 0:
        parts.append(f"skipped {n} update{'s' * (n > 1)}")
        lost += n
    for ev in out.rows("event"):
        if ev.get("event") == "rollback":
            parts.append(f"rolled back {ev['from_step']}->{ev['to_step']}")
            # Steps to_step .. from_step (0-based, the bad one included) are recomputed.
            lost += int(ev["from_step"]) + 1 - int(ev["to_step"])
    if "R203" in codes:
        parts.append("halted")
    if "R205" in codes:
        parts.append("rerun: hardware")
    elif "R206" in codes:
        parts.append("rerun: data/software")
    return "; ".join(parts), lost


def finish(row: DrillRow, out: RunOutcome, ctx: DrillContext) -> DrillRow:
    """Fill in whether the (last) run completed and its final loss."""
    row.finished = out.returncode == 0 and out.final_step == ctx.plan.max_steps
    row.final_loss = out.final_loss
    if not row.finished:
        row.note = (row.note + "; " if row.note else "") + (
            f"run exited {out.returncode} at step {out.final_step}: {out.tail()}"
        )
    return row


# --- the two drill shapes ---------------------------------------------------------------------
def guarded_drill(
    ctx: DrillContext,
    name: str,
    inject: str,
    expected: list[str],
    related: tuple[str, ...] = (),
    fault_step: int | None = None,
) -> DrillRow:
    """A fault the in-run guard must catch and act on, within one process."""
    fault_step = ctx.plan.fault_step if fault_step is None else fault_step
    out = ctx.launch(name, inject=inject)
    row = DrillRow(name, "", expected, inject=inject)
    row.detected = present(out, (*expected, *related))
    first = out.first_step(tuple(expected))
    row.steps_to_detect = None if first is None else first - fault_step
    row.action, row.steps_lost = actions_taken(out)
    return finish(row, out, ctx)


def relaunch_drill(
    ctx: DrillContext,
    name: str,
    inject: str,
    expected: list[str],
    related: tuple[str, ...] = (),
    exit_status: int = -signal.SIGKILL,
    between: Callable[[RunOutcome], None] | None = None,
) -> DrillRow:
    """A fault that ends the process: run with the fault, check it died as expected, let
    `between` tamper with what it left, then relaunch without the fault (the launcher's
    restart) and check that auto-resume brings the run to its end."""
    first = ctx.launch(name, inject=inject)
    row = DrillRow(name, "", expected, inject=inject)
    if first.returncode != exit_status:
        row.note = f"the faulty run exited {first.returncode}, expected {exit_status}"
        return finish(row, first, ctx)
    logged = first.last_logged_step()
    if between is not None:
        between(first)
    second = ctx.launch(name)
    row.detected = present(second, (*expected, *related))
    resumed = (second.payload or {}).get("resumed_from") or 0
    row.steps_to_detect = 0  # the crash is the detection: the launcher sees it at once
    row.steps_lost = max(0, logged + 1 - resumed)  # logged: a 0-based index
    row.action = f"relaunch; auto-resume from step {resumed}"
    return finish(row, second, ctx)
