"""Goodput accounting: where a run's wall time went, across all its restarts (docs/goodput.md).

The record is the run's `metrics.jsonl`: step rows (`time`, the wall clock at the end of the
step; `step_time_s`; `data_time_s`; `action`), rollback events, and the `timing` rows a run
writes for this (`goodput/rows.py`: their format and builders; `trainguard run` writes them
through `train/callbacks/goodput.py`, a user's loop with the builders).

`account(rows)` walks the rows in file order with a cursor on the wall clock; every second
between the first process start and the last record lands in exactly one category, so the
categories sum to the wall time (a gap no record explains is `other`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.goodput.rows import TIMING
from trainguard.goodput.rows import finite as _num

CATEGORIES = (
    "productive",  # steps whose update was kept, their data-loader wait excepted
    "checkpoint",  # saves blocking the loop: the save itself and the wait for its copy
    "startup",  # the first process start to the first step
    "restart",  # a failure (the last record of the dead process) to the next first step
    "redone",  # steps thrown away by a restart or a rollback, and what ran between them
    "skipped",  # steps whose update the guard skipped
    "eval",  # validation and use-case evaluations
    "data_wait",  # the data loader's share of the kept steps
    "other",  # what no record explains: logging, callbacks, the gaps between steps
)


@dataclass
class Restart:
    """One process after the first: what the failure before it cost."""

    lost_steps: int  # step rows the resume's cut dropped (recomputed)
    lost_s: float  # from the last kept record of the dead process to its last record
    downtime_s: float  # its last record to this process's start
    startup_s: float  # this process's start to its first step
    resumed_from: int | None
    began: float = 0.0  # wall time of the dead process's last record

    def to_dict(self) -> dict[str, Any]:
        return {
            "lost_steps": self.lost_steps,
            "lost_s": self.lost_s,
            "downtime_s": self.downtime_s,
            "startup_s": self.startup_s,
            "restart_s": self.downtime_s + self.startup_s,
            "resumed_from": self.resumed_from,
            "began": self.began,
            "resumed_at": self.began + self.downtime_s + self.startup_s,
        }


@dataclass
class Goodput:
    """Seconds per category (they sum to `wall_s`), and what was counted."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    wall_s: float = 0.0
    attempts: int = 0
    restarts: list[Restart] = field(default_factory=list)
    steps: int = 0  # kept (applied) steps
    redone_steps: int = 0
    rollback_steps: int = 0  # of them, thrown away by rollbacks
    skipped_steps: int = 0
    checkpoint_stalls: list[float] = field(default_factory=list)  # each save's, copy included
    checkpoint_writes: list[float] = field(default_factory=list)
    recorded: bool = False  # the record has timing rows (else: steps only, no start-up)

    @property
    def goodput(self) -> float | None:
        return self.seconds["productive"] / self.wall_s if self.wall_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        wall = self.wall_s
        return {
            "goodput": self.goodput,
            "wall_s": wall,
            "seconds": dict(self.seconds),
            "shares": {k: (v / wall if wall > 0 else None) for k, v in self.seconds.items()},
            "attempts": self.attempts,
            "restarts": [r.to_dict() for r in self.restarts],
            "steps": self.steps,
            "redone_steps": self.redone_steps,
            "rollback_steps": self.rollback_steps,
            "skipped_steps": self.skipped_steps,
            "checkpoints": {
                "saves": len(self.checkpoint_stalls),
                "median_stall_s": _median(self.checkpoint_stalls),
                "median_write_s": _median(self.checkpoint_writes),
            },
            "recorded": self.recorded,
        }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass
class _Step:
    step: int
    seconds: float  # counted on the timeline
    data_s: float
    copy_s: float
    label: str  # productive | skipped | redone


class _Walk:
    def __init__(self) -> None:
        self.out = Goodput()
        self.cursor: float | None = None
        self.context = "startup"  # what a gap before the next record is
        self.steps: list[_Step] = []
        self.rolled_back = False  # a rollback event since the last step row
        self.pending_start: tuple[float, Restart | None] | None = None
        self.last_step: _Step | None = None
        self.first_start: float | None = None

    def add(self, category: str, seconds: float) -> None:
        self.out.seconds[category] += max(0.0, seconds)

    def span(self, end: float, seconds: float, category: str | None) -> float:
        """Count the gap before [end - seconds, end] by context and the span as `category`
        (None: the caller splits it); returns the part of the span counted."""
        if self.cursor is None:  # a record without an attempt row: the timeline starts here
            self.cursor = self.first_start = end - seconds
        if end <= self.cursor:
            return 0.0
        start = max(end - seconds, self.cursor)
        self.add(self.context, start - self.cursor)
        counted = end - start
        if category is not None:
            self.add(category, counted)
        self.cursor = end
        return counted

    def attempt(self, r: dict[str, Any]) -> None:
        self.out.attempts += 1
        self.out.recorded = True
        start = _num(r.get("process_start"))
        if start is None:
            start = _num(r.get("time")) or 0.0
        launcher = _num(r.get("launcher_start"))
        lost = r.get("lost") if isinstance(r.get("lost"), dict) else None
        restart = None
        if self.cursor is not None:
            until = _num((lost or {}).get("until"))
            lost_s = 0.0
            if until is not None and until > self.cursor:
                lost_s = until - self.cursor
                self.add("redone", lost_s)
                self.cursor = until
            if launcher is not None and self.cursor < launcher < start:
                start = launcher  # a launcher started after the failure: the relaunch
            lost_steps = lost.get("steps") if lost else 0
            lost_steps = lost_steps if isinstance(lost_steps, int) else 0
            self.out.redone_steps += lost_steps
            began, downtime = self.cursor, max(0.0, start - self.cursor)
            self.add("restart", downtime)
            self.cursor = max(self.cursor, start)
            resumed = r.get("resumed_from")
            restart = Restart(lost_steps, lost_s, downtime, 0.0, resumed, began)
            self.out.restarts.append(restart)
            self.context = "restart"
        else:
            if launcher is not None and launcher < start:
                start = launcher  # `run --nproc`: the job began with its launcher
            self.cursor = self.first_start = start
            self.context = "startup"
        self.pending_start = (self.cursor, restart)
        self.last_step = None

    def first_step(self, r: dict[str, Any]) -> None:
        """The start of this process's first step: the end of its start-up or restart, also
        when a later resume dropped that step's row (then the steps after it are redone)."""
        start = _num(r.get("time"))
        if start is None or self.cursor is None or self.pending_start is None:
            return
        t0, restart = self.pending_start
        if restart is not None:
            restart.startup_s = max(0.0, start - t0)
        self.pending_start = None
        self.span(start, 0.0, None)

    def step(self, r: dict[str, Any]) -> None:
        end = _num(r.get("time"))
        if end is None:
            return
        dur = _num(r.get("step_time_s")) or 0.0
        step = r.get("step") if isinstance(r.get("step"), int) else -1
        if self.rolled_back:
            # The steps a rollback threw away: those before it from this step on.
            for s in self.steps:
                if s.step >= step and s.label != "redone":
                    s.label = "redone"
                    self.out.rollback_steps += 1
            self.rolled_back = False
        if self.pending_start is not None and self.cursor is not None:  # the first step
            t0, restart = self.pending_start
            if restart is not None:
                restart.startup_s = max(0.0, max(end - max(0.0, dur), self.cursor) - t0)
            self.pending_start = None
        counted = self.span(end, max(0.0, dur), None)
        data = min(max(0.0, _num(r.get("data_time_s")) or 0.0), counted)
        label = "skipped" if r.get("action") == "skip" else "productive"
        entry = _Step(step, counted, data, 0.0, label)
        self.steps.append(entry)
        self.last_step = entry
        self.context = "other"

    def phase(self, r: dict[str, Any], category: str) -> None:
        end, seconds = _num(r.get("time")), _num(r.get("seconds"))
        if end is None or seconds is None:
            return
        counted = self.span(end, max(0.0, seconds), category)
        if category == "checkpoint":
            self.out.checkpoint_stalls.append(counted)

    def copy_wait(self, r: dict[str, Any]) -> None:
        seconds = _num(r.get("seconds"))
        s = self.last_step
        if seconds is None or s is None:
            return
        moved = min(max(0.0, seconds), s.seconds - s.data_s - s.copy_s)
        s.copy_s += moved
        if self.out.checkpoint_stalls:
            self.out.checkpoint_stalls[-1] += moved

    def rollback(self) -> None:
        self.rolled_back = True
        self.context = "redone"  # the step that asked for it, and the restore

    def finish(self) -> Goodput:
        out = self.out
        for s in self.steps:
            out.seconds["checkpoint"] += s.copy_s
            rest = s.seconds - s.copy_s
            if s.label == "productive":
                out.seconds["data_wait"] += s.data_s
                out.seconds["productive"] += rest - s.data_s
                out.steps += 1
            else:
                out.seconds[s.label] += rest
                if s.label == "skipped":
                    out.skipped_steps += 1
                else:
                    out.redone_steps += 1
        first = self.first_start
        out.wall_s = (self.cursor - first) if self.cursor is not None and first is not None else 0.0
        return out


def account(rows: list[dict[str, Any]]) -> Goodput:
    """Where the wall time of the run in `rows` (metrics.jsonl, in file order) went."""
    walk = _Walk()
    for r in rows:
        kind = r.get("kind")
        if kind == TIMING:
            what = r.get("what")
            if what == "attempt":
                walk.attempt(r)
            elif what in ("checkpoint", "eval"):
                walk.phase(r, str(what))
            elif what == "first_step":
                walk.first_step(r)
            elif what == "copy_wait":
                walk.copy_wait(r)
            elif what == "write" and (w := _num(r.get("seconds"))) is not None:
                walk.out.checkpoint_writes.append(w)
            elif what == "end" and (end := _num(r.get("time"))) is not None:
                walk.span(end, 0.0, None)
        elif kind == "step":
            walk.step(r)
        elif kind == "event" and r.get("event") == "rollback":
            walk.rollback()
    return walk.finish()


def account_run(run_dir: Path) -> Goodput:
    """`account` of RUN_DIR/metrics.jsonl."""
    from trainguard.metrics.record_read import read_record

    return account(read_record(Path(run_dir)).rows)  # steps from 0, any release
