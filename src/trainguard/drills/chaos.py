"""`trainguard drill --chaos DURATION`: a soak. Rounds of one real `trainguard run` under a
seeded fault schedule (`chaos_schedule.py`), relaunched as a scheduler would (the same command
again) after every fault that ends it, to its last step; then what each fault cost and whether
the final model equals a run without the faults that end the process (bitwise on CPU).

A round is two runs, one after the other (never more than one process at a time):
1. the reference: the same recipe with the schedule's data faults (NaN batches: the guard skips
   those updates in any run that reads them), none that ends the process; with no data fault
   in the schedule it is a fault-free run;
2. the soak run: every data fault, and the next fault that ends the process, one per launch.
   A `corrupt` fault's launch is killed, then a byte of the newest checkpoint's weights flips.

Per fault: whether it was detected (the code that must catch it, or the exit the launcher saw),
the detection latency (seconds from the dead process's last record to its exit; steps from a
data fault to its finding), the recovery time (goodput accounting's restart: the last record of
the dead process to the first resumed step) and the steps lost (the steps a resume recomputed,
or the skipped update). Rounds go on while the next is expected to end within DURATION; at
least one runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.drills.chaos_schedule import DETECTED_BY, HANGS, RANK_KINDS, Fault, schedule
from trainguard.drills.runner import DrillContext, RunOutcome
from trainguard.errors import ExitStatus
from trainguard.goodput.accounting import account_run
from trainguard.goodput.rows import TIMING
from trainguard.metrics.jsonl import read_metrics


def _catches(fault: Fault, finding: dict[str, Any]) -> bool:
    """`finding` is one of the codes that must catch `fault`; a fault on rank 1 must be named
    there (a code naming another rank does not count)."""
    if finding.get("code") not in DETECTED_BY[fault.kind]:
        return False
    return fault.kind not in RANK_KINDS or finding.get("rank") == 1


def _fired(fault: Fault, returncode: int) -> bool:
    """The launch ended as `fault` ends a job: exit 3 for a hang (the watchdog, the hung-rank
    diagnosis), else killed (-9 for one process; a launcher whose workers were killed exits
    with its own non-zero status)."""
    if fault.kind in HANGS:
        return returncode == ExitStatus.HANG
    return returncode not in (0, ExitStatus.HANG)


@dataclass
class FaultResult:
    fault: Fault
    detected: bool = False
    codes: list[str] = field(default_factory=list)
    detect_s: float | None = None
    detect_steps: int | None = None
    recovery_s: float | None = None
    steps_lost: int | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.fault.to_dict(),
            "detected": self.detected,
            "codes": self.codes,
            "detect_s": self.detect_s,
            "detect_steps": self.detect_steps,
            "recovery_s": self.recovery_s,
            "steps_lost": self.steps_lost,
            "note": self.note,
        }


@dataclass
class Launch:
    inject: str
    returncode: int
    started: float  # wall clock
    ended: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "inject": self.inject,
            "exit": self.returncode,
            "seconds": self.ended - self.started,
        }


@dataclass
class Round:
    number: int
    run_dir: Path
    faults: list[FaultResult]
    launches: list[Launch]
    final_step: int | None
    finished: bool
    bitwise_equal: bool | None
    goodput: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.number,
            "faults": [f.to_dict() for f in self.faults],
            "launches": [x.to_dict() for x in self.launches],
            "final_step": self.final_step,
            "finished": self.finished,
            "bitwise_equal": self.bitwise_equal,
            "goodput": self.goodput,
        }


def _corrupt_newest(run_dir: Path) -> str:
    """Flip a byte inside the newest committed checkpoint's tensors (the file still parses)."""
    from trainguard.checkpoint.manifest import parse_step_dirname
    from trainguard.checkpoint.read import STATE_TENSORS

    root = run_dir / "checkpoints"
    steps = [
        (s, p)
        for p in (root.iterdir() if root.is_dir() else ())
        if (s := parse_step_dirname(p.name)) is not None and (p / "manifest.json").is_file()
    ]
    if not steps:
        return "no checkpoint to corrupt"
    step, folder = max(steps)
    path = folder / STATE_TENSORS  # the tensors of the one checkpoint format
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return f"a byte of step-{step}/{STATE_TENSORS} flipped"


def _launch(ctx: DrillContext, name: str, inject: list[str]) -> tuple[RunOutcome, Launch]:
    text = ",".join(inject)
    started = time.time()
    out = ctx.launch(name, inject=text or None)
    return out, Launch(text, out.returncode, started, time.time())


def run_round(
    ctx: DrillContext,
    seed: int,
    number: int,
    count: int,
    kinds: tuple[str, ...],
    say: Callable[[str], None] = lambda _: None,
) -> Round:
    plan = ctx.plan
    faults = schedule(seed, number, plan.max_steps, plan.interval, count, kinds)
    data = [f.inject for f in faults if not f.ends_process]
    say(f"round {number}: faults {', '.join(f.label for f in faults)}")
    say(f"round {number}: the reference run ({', '.join(data) or 'no fault'})")
    reference, _ = _launch(ctx, f"round{number}-reference", data)
    name = f"round{number}"
    pending = [f for f in faults if f.ends_process]
    outs: list[tuple[RunOutcome, Launch, Fault | None]] = []
    notes: dict[Fault, str] = {}
    while True:
        fault = pending[0] if pending else None
        say(f"round {number}: launch {len(outs) + 1}" + (f" ({fault.label})" if fault else ""))
        out, launch = _launch(ctx, name, [*data, *([fault.inject] if fault else [])])
        outs.append((out, launch, fault))
        say(f"round {number}: launch {len(outs)} exited {out.returncode}")
        if fault is None or not _fired(fault, out.returncode):
            break  # finished, or ended otherwise than the fault says: no more relaunches
        pending.pop(0)
        if fault.kind == "corrupt":
            notes[fault] = _corrupt_newest(ctx.run_dir(name))
    last = outs[-1][0]
    goodput = account_run(ctx.run_dir(name))
    results = _results(faults, outs, goodput, ctx.run_dir(name), notes)
    ours, theirs = last.weights_checksum(), reference.weights_checksum()
    return Round(
        number,
        ctx.run_dir(name),
        results,
        [launch for _, launch, _ in outs],
        last.final_step,
        last.returncode == 0 and last.final_step == plan.max_steps,
        None if ours is None or theirs is None else ours == theirs,
        goodput.to_dict(),
    )


def _results(
    faults: list[Fault],
    outs: list[tuple[RunOutcome, Launch, Fault | None]],
    goodput: Any,
    run_dir: Path,
    notes: dict[Fault, str],
) -> list[FaultResult]:
    rows = read_metrics(run_dir)
    findings = [r for r in rows if r.get("kind") == "finding"]
    logged = _findings_by_launch(rows)
    for out, _, _ in outs:
        findings += out.findings
    fired = [(i, f) for i, (out, _, f) in enumerate(outs) if f and _fired(f, out.returncode)]
    results = []
    for fault in faults:
        res = FaultResult(fault, note=notes.get(fault, ""))
        if fault.ends_process:
            done = [k for k, (i, f) in enumerate(fired) if f == fault]
            if done:
                k = done[0]
                i = fired[k][0]
                res.codes = [f"exit {outs[i][0].returncode}"]
                # The codes that show it, in the dying launch or the next one's resume.
                # A launch killed later prints no result: what its resume logged counts too.
                around = [
                    *outs[i][0].findings,
                    *(outs[i + 1][0].findings if i + 1 < len(outs) else []),
                    *(logged[i + 1] if i + 1 < len(logged) else []),
                ]
                res.codes += sorted({f["code"] for f in around if _catches(fault, f)})
                res.detected = not DETECTED_BY[fault.kind] or len(res.codes) > 1
                if k < len(goodput.restarts):
                    r = goodput.restarts[k]
                    res.detect_s = max(0.0, outs[i][1].ended - r.began)
                    res.recovery_s = r.downtime_s + r.startup_s
                    res.steps_lost = r.lost_steps
            else:
                res.note = (res.note + "; " if res.note else "") + "the fault did not end the job"
        else:
            steps = [
                f["step"]
                for f in findings
                if _catches(fault, f) and isinstance(f.get("step"), int) and f["step"] >= fault.step
            ]
            res.detected = bool(steps)
            if steps:
                res.codes = list(DETECTED_BY[fault.kind])
                res.detect_steps = min(steps) - fault.step
                # A NaN batch's update is skipped; a slow rank is reported, nothing thrown away.
                res.steps_lost = 1 if fault.kind == "nan" else 0
        results.append(res)
    return results


def run_chaos(
    ctx: DrillContext,
    duration_s: float,
    seed: int,
    count: int,
    kinds: tuple[str, ...],
    say: Callable[[str], None] = lambda _: None,
) -> list[Round]:
    """Rounds while the next is expected to end within `duration_s` (at least one)."""
    t0 = time.monotonic()
    rounds: list[Round] = []
    while True:
        rounds.append(run_round(ctx, seed, len(rounds) + 1, count, kinds, say))
        elapsed = time.monotonic() - t0
        if elapsed + elapsed / len(rounds) > duration_s:
            return rounds


def _findings_by_launch(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The finding rows each launch logged, in launch order: every process of the run writes
    a goodput `attempt` row before its resume and first step (goodput/rows.py), and a resume
    keeps the checkpoint findings (C codes) of the step it starts from."""
    launches: list[list[dict[str, Any]]] = []
    for r in rows:
        if r.get("kind") == TIMING and r.get("what") == "attempt":
            launches.append([])
        elif r.get("kind") == "finding" and launches:
            launches[-1].append(r)
    return launches
