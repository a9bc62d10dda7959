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

What a launch is comes from a launcher: `RunLauncher` (`trainguard run`, faults injected inside
it) or `chaos_external.CommandLauncher` (a user's command, faults sent from outside; one
fault-free reference run for the whole soak).
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
    inject: str | None = None  # how the launcher delivers it (default: TRAINGUARD_INJECT's item)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.fault.to_dict(),
            **({"inject": self.inject} if self.inject is not None else {}),
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


def corrupt_newest(root: Path) -> str:
    """Flip a byte inside the tensors of the newest committed checkpoint under `root` (the file
    still parses; its checksum no longer matches, C101/C102 on resume)."""
    from trainguard.checkpoint.manifest import parse_step_dirname
    from trainguard.checkpoint.read import STATE_TENSORS

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


class RunLauncher:
    """The soak of `trainguard run`: each launch a `trainguard run` of the drill context, its
    faults injected inside the run (TRAINGUARD_INJECT, faults.py); each round its own reference
    run with the round's data faults. `chaos_external.CommandLauncher` is the same interface
    for a user's command, its faults sent from outside."""

    def __init__(self, ctx: DrillContext) -> None:
        self.ctx = ctx
        self.steps, self.interval = ctx.plan.max_steps, ctx.plan.interval

    def run_dir(self, name: str) -> Path:
        return self.ctx.run_dir(name)

    def describe(self, faults: list[Fault]) -> str:
        return ",".join(f.inject for f in faults)

    def launch(self, name: str, faults: list[Fault]) -> RunOutcome:
        return self.ctx.launch(name, inject=self.describe(faults) or None)

    def reference(self, number: int, data: list[Fault], say: Callable[[str], None]) -> RunOutcome:
        say(f"round {number}: the reference run ({self.describe(data) or 'no fault'})")
        return self.launch(f"round{number}-reference", data)

    def fired(self, fault: Fault, out: RunOutcome) -> bool:
        return _fired(fault, out.returncode)

    def corrupt(self, name: str) -> str:
        return corrupt_newest(self.run_dir(name) / "checkpoints")

    def settings(self) -> list[str]:
        return self.ctx.settings()


def _launch(launcher: Any, name: str, faults: list[Fault]) -> tuple[Any, Launch]:
    started = time.time()
    out = launcher.launch(name, faults)
    return out, Launch(launcher.describe(faults), out.returncode, started, time.time())


def run_round(
    launcher: Any,
    seed: int,
    number: int,
    count: int,
    kinds: tuple[str, ...],
    say: Callable[[str], None] = lambda _: None,
) -> Round:
    """One round with `launcher` (`RunLauncher`, or `chaos_external.CommandLauncher`)."""
    faults = schedule(seed, number, launcher.steps, launcher.interval, count, kinds)
    data = [f for f in faults if not f.ends_process]
    say(f"round {number}: faults {', '.join(f.label for f in faults)}")
    reference = launcher.reference(number, data, say)
    name = f"round{number}"
    pending = [f for f in faults if f.ends_process]
    outs: list[tuple[Any, Launch, Fault | None]] = []
    notes: dict[Fault, str] = {}
    while True:
        fault = pending[0] if pending else None
        say(f"round {number}: launch {len(outs) + 1}" + (f" ({fault.label})" if fault else ""))
        out, launch = _launch(launcher, name, [*data, *([fault] if fault else [])])
        outs.append((out, launch, fault))
        say(f"round {number}: launch {len(outs)} exited {out.returncode}")
        if fault is None or not launcher.fired(fault, out):
            break  # finished, or ended otherwise than the fault says: no more relaunches
        pending.pop(0)
        if fault.kind == "corrupt":
            notes[fault] = launcher.corrupt(name)
    last = outs[-1][0]
    run_dir = launcher.run_dir(name)
    goodput = account_run(run_dir)
    results = _results(faults, outs, goodput, run_dir, notes, launcher.fired)
    for res in results:
        res.inject = launcher.describe([res.fault])
    ours, theirs = last.weights_checksum(), reference.weights_checksum()
    return Round(
        number,
        run_dir,
        results,
        [launch for _, launch, _ in outs],
        last.final_step,
        last.returncode == 0 and last.final_step == launcher.steps,
        None if ours is None or theirs is None else ours == theirs,
        goodput.to_dict(),
    )


def _results(
    faults: list[Fault],
    outs: list[tuple[Any, Launch, Fault | None]],
    goodput: Any,
    run_dir: Path,
    notes: dict[Fault, str],
    fired_by: Callable[[Fault, Any], bool],
) -> list[FaultResult]:
    rows = read_metrics(run_dir)
    findings = [r for r in rows if r.get("kind") == "finding"]
    logged = _findings_by_launch(rows)
    for out, _, _ in outs:
        findings += out.findings
    fired = [(i, f) for i, (out, _, f) in enumerate(outs) if f and fired_by(f, out)]
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
    launcher: Any,
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
        rounds.append(run_round(launcher, seed, len(rounds) + 1, count, kinds, say))
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
