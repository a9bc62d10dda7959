"""Multi-process fire drills: real `trainguard run --nproc N` jobs (gloo on CPU) with one fault
on rank 1 (`/r1` in `TRAINGUARD_INJECT`, see `faults.py` and docs/distributed.md).

- `replica`    `bitflip@F+1/r1`, 3 ranks: the replica check (every 2 steps) names rank 1
               (H201) and every rank rolls back to the newest checkpoint.
- `straggler`  `slow@F/r1`, 2 ranks: the straggler monitor (every 2 steps) names rank 1 (H202);
               the job goes on, a straggler is reported, not repaired.
- `hung_rank`  `sleep@F+I/2/r1`, 2 ranks: the gradient all-reduce times out, the diagnosis
               barrier names rank 1 (R301), stacks are dumped, the job exits 3; a relaunch
               without the fault auto-resumes to the end.

Every finding must name rank 1 (the `rank` of the finding); a code that names another rank does
not count as detection.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from trainguard.drills.matrix import DrillRow
from trainguard.drills.registry import actions_taken, finish, present, relaunch_drill
from trainguard.drills.runner import DrillContext, RunOutcome
from trainguard.errors import ExitStatus

RANK = 1  # the faulty rank of every multi-process drill
# Ranks of each drill's job (`drill` counts them against the cores before it starts).
PROCESSES = {"replica": 3, "straggler": 2, "hung_rank": 2}

# The hung-rank drill's timeouts: the all-reduce gives up after 8 s, the diagnosis barrier
# waits 4 s more. The single-process hang watchdog (R210) must stay out of the way in every
# multi-process drill: at the drill settings' 5 s floor it fires first in `hung_rank` (in rank
# 0's backward, naming no culprit), and on a loaded machine it fires in the first step of a
# 2- or 3-process job on the default recipe (ranks wait in the first all-reduce for the
# slowest one's first batch). 30 s is well above 8 + 4 s and any healthy step.
COLLECTIVE_TIMEOUT_S, HANG_TIMEOUT_S, HANG_FLOOR_S = 8, 4, 30


@dataclass
class MultiProcRow(DrillRow):
    """A drill row of a multi-process job."""

    nproc: int = 2
    incomparable: str = ""
    """Why the final loss cannot be compared with the clean (1-process) run's; "" when it
    can: the global batch and its order do not depend on the number of processes, so a job
    of N processes at the same batch size ends on the clean run's loss (to reduction-order
    error)."""
    repaired: bool = True
    """The fault did not come back after the action (e.g. replicas agreed at every later
    check)."""

    def compare_with(self, clean: DrillRow) -> None:
        if not self.incomparable:
            super().compare_with(clean)

    @property
    def recovered(self) -> bool:
        if not self.repaired:
            return False
        if self.incomparable:
            return self.finished
        return super().recovered

    def cells(self) -> list[str]:
        cells = super().cells()
        if self.incomparable:
            loss = "-" if self.final_loss is None else f"{self.final_loss:.4f}"
            cells[-1] = f"n/a: {self.incomparable} ({loss})"
        return cells


def _multiproc(ctx: DrillContext, nproc: int, *settings: str) -> DrillContext:
    """`ctx` for `trainguard run --nproc N`, with the drill's own settings last (they win).
    --oversubscribe: `drill` has checked its jobs' processes against the machine already."""
    return dataclasses.replace(
        ctx,
        run_args=(*ctx.run_args, "--nproc", str(nproc), "--oversubscribe"),
        overrides=[*ctx.overrides, f"guards.hang_floor_s={HANG_FLOOR_S}", *settings],
    )


Findings = list[dict[str, Any]]


def _naming(findings: Findings, code: str) -> tuple[Findings, Findings]:
    """Findings of `code` that name the faulty rank, and those that name another (or none)."""
    found = [f for f in findings if f.get("code") == code]
    return [f for f in found if f.get("rank") == RANK], [f for f in found if f.get("rank") != RANK]


def _who(f: dict[str, Any]) -> str:
    return f"rank {f['rank']} ({f.get('where') or '?'})"


def _wrong_rank(row: DrillRow, code: str, wrong: Findings) -> None:
    """A code that named the wrong rank is shown as such and does not count as detection."""
    if not wrong:
        return
    row.detected = [c for c in row.detected if c != code] + [f"{code}@wrong-rank"]
    named = ", ".join(str(f.get("rank")) for f in wrong)
    row.note = (row.note + "; " if row.note else "") + f"{code} named rank(s) {named}, not {RANK}"


def replica_corruption(ctx: DrillContext) -> DrillRow:
    # The fault is checked at the next even step.
    nproc, fault_step = PROCESSES["replica"], ctx.plan.fault_step + 1
    mctx = _multiproc(ctx, nproc, "train.batch_size=6", "distributed.replica_check_interval=2")
    inject = f"bitflip@{fault_step}/r{RANK}"
    out = mctx.launch("replica", inject=inject)
    row = MultiProcRow("replica", "", ["H201"], inject=inject, nproc=nproc)
    row.incomparable = "3 ranks need batch 6, the clean run's is 8"
    row.detected = present(out, ["H201"])
    named, wrong = _naming(out.findings, "H201")
    _wrong_rank(row, "H201", wrong)
    first = min((f["step"] for f in named), default=None)
    row.steps_to_detect = None if first is None else first - fault_step
    action, row.steps_lost = actions_taken(out)
    who = _who(named[0]) if named else "no rank"
    row.action = f"{who} named; {action or 'no rollback'}"
    if "rolled back" not in action:
        row.repaired = False
        row.note = (row.note + "; " if row.note else "") + "no rollback after H201"
    elif len(named) + len(wrong) > 1:
        row.repaired = False
        row.note = (row.note + "; " if row.note else "") + (
            f"the replicas diverged again after the rollback ({len(named) + len(wrong)} H201)"
        )
    return finish(row, out, ctx)


def straggler(ctx: DrillContext) -> DrillRow:
    # The fault lands after many intervals of history.
    nproc, fault_step = PROCESSES["straggler"], ctx.plan.fault_step
    mctx = _multiproc(ctx, nproc, "distributed.straggler_interval=2")
    inject = f"slow@{fault_step}/r{RANK}"
    out = mctx.launch("straggler", inject=inject)
    row = MultiProcRow("straggler", "", ["H202"], inject=inject, nproc=nproc)
    row.detected = present(out, ["H202", "R106"])  # R106: the job's throughput drops too
    named, wrong = _naming(out.findings, "H202")
    _wrong_rank(row, "H202", wrong)
    first = min((f["step"] for f in named), default=None)
    row.steps_to_detect = None if first is None else first - fault_step
    action, row.steps_lost = actions_taken(out)
    score = named[0].get("data", {}).get("score") if named else None
    who = f"{_who(named[0])} named" if named else "nobody named"
    row.action = f"reported: {who}" + (f", score {score:.2f}" if score is not None else "")
    row.action += "; training went on" + (f"; {action}" if action else "")
    return finish(row, out, ctx)


def hung_rank(ctx: DrillContext) -> DrillRow:
    nproc, fault_step = PROCESSES["hung_rank"], ctx.plan.fault_step + ctx.plan.interval // 2
    mctx = _multiproc(
        ctx,
        nproc,
        f"distributed.collective_timeout_s={COLLECTIVE_TIMEOUT_S}",
        f"distributed.hang_timeout_s={HANG_TIMEOUT_S}",
    )
    inject = f"sleep@{fault_step}/r{RANK}"
    seen: dict[str, Any] = {}

    def read_diagnosis(first: RunOutcome) -> None:
        # R301 lives in the dead job's metric log (rank 0 wrote it before exiting 3).
        seen["findings"] = [dict(r) for r in first.rows("finding")]
        run_dir = first.run_dir
        seen["reports"] = sorted(p.name for p in run_dir.glob("hang-*-rank*.txt"))
        seen["stacks"] = sorted(
            p.name for p in run_dir.glob("stacks-rank*.txt") if p.stat().st_size > 0
        )

    base = relaunch_drill(
        mctx,
        "hung_rank",
        inject,
        ["R301"],
        ("C150",),
        exit_status=ExitStatus.HANG,
        between=read_diagnosis,
    )
    row = MultiProcRow(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
    row.nproc = nproc
    if "findings" not in seen:  # the job did not exit 3: relaunch_drill said why
        return row
    named, wrong = _naming(seen["findings"], "R301")
    if named:
        row.detected = ["R301", *[c for c in row.detected if c != "R301"]]
        row.steps_to_detect = named[0]["step"] - fault_step
    _wrong_rank(row, "R301", wrong)
    # Rank 0 dumps its stacks with the R301 (hang-*-rank0.txt); the launcher's SIGTERM makes the
    # hung rank dump its own (stacks-rank1-*.txt).
    dumped = sorted(
        {int(n.rsplit("rank", 1)[1].split(".")[0]) for n in seen["reports"]}
        | {int(n.split("-")[1].removeprefix("rank")) for n in seen["stacks"]}
    )
    if RANK not in dumped:
        row.note = (row.note + "; " if row.note else "") + f"no stack dump of rank {RANK}"
    who = _who(named[0]) if named else "no rank"
    row.action = (
        f"R301 {who} after {COLLECTIVE_TIMEOUT_S}+{HANG_TIMEOUT_S}s; "
        f"stacks of rank {', '.join(map(str, dumped)) or 'none'} dumped, exit 3; {row.action}"
    )
    return row


# name -> (fault shown in the matrix, drill); registered by drills/scenarios.py, last, in this
# order.
MULTIPROC_DRILLS = {
    "replica": ("silent corruption of one replica (3 ranks)", replica_corruption),
    "straggler": ("one rank 0.2 s slower per step (2 ranks)", straggler),
    "hung_rank": ("one rank hangs in the forward pass (2 ranks)", hung_rank),
}
