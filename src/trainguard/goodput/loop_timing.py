"""The goodput timing rows of a user's loop (`goodput/rows.py`), written into its run record by
the `Guard` (`guard.record`, metrics/record.py) so that any loop's record is accounted like
`trainguard run`'s: start-up, restarts, steps redone after a crash, checkpoint stalls, evals.

The loop says nothing extra. A process joins the record at its first step: the step index it
computes first is where it resumed (0 and an empty log: a fresh start). There the log is cut
as a resume of `trainguard run` cuts it (`MetricsLog.truncate_after`: the rows of the steps
this process recomputes), and an `attempt` row says what the cut dropped. Rows the loop
logs before its first step (a checkpoint passed over at load, C101) wait for that cut: written
before it they would speak of a step past the resume and be dropped with the crashed
attempt's rows; written after the attempt row they belong to this process's start.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from trainguard.goodput import rows as acc
from trainguard.metrics.record import RecordWriter
from trainguard.util.processes import process_started_at

TIMED_PHASES = ("checkpoint", "eval")  # the loop's `guard.phase(...)` that goodput counts


class LoopTiming:
    """Writes a loop's rows to `record` with the goodput timing rows around them."""

    def __init__(self, record: RecordWriter) -> None:
        self.record = record
        self.joined = False  # the attempt row is written (at the first step)
        self.held: list[Mapping[str, Any]] = []  # rows logged before the first step
        self.last_step: int | None = None

    def step(
        self,
        step: int,
        values: Mapping[str, Any],
        action: str,
        router_stats: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Step `step`'s row; the first one of this process joins the record first."""
        first = not self.joined
        if first:
            self._join(step)
        row = self.record.step_row(step, values, action, router_stats)
        if first:
            # The step's start; a first row without a step time (no previous row to time it
            # from) starts at its end: that step is counted as start-up.
            self.record.write(acc.first_step_row(row["time"] - row.get("step_time_s", 0.0)))
        self.record.write(row)
        self.last_step = step

    def write(self, row: Mapping[str, Any]) -> None:
        """A finding or an event: held until the first step (see the module's docstring)."""
        if self.joined:
            self.record.write(row)
        else:
            self.held.append(row)

    def phase(self, name: str, step: int, seconds: float) -> None:
        """A checkpoint save or an evaluation the loop marked with `guard.phase` ended."""
        if name in TIMED_PHASES and self.joined:
            self.record.write(acc.phase_row(name, step, seconds, time.time()))

    def close(self) -> None:
        """The loop is done: its held rows (a process that never stepped) and the end."""
        for row in self.held:
            self.record.write(row)
        self.held = []
        if self.joined and self.last_step is not None:
            self.record.write(acc.end_row(self.last_step, time.time()))

    def _join(self, step: int) -> None:
        self.joined = True
        # The cut reads the log once. A fresh start (step 0, nothing dropped) is no resume;
        # step 0 after step rows of an earlier process is one (it crashed before its first
        # checkpoint): those steps are redone.
        dropped = self.record.log.truncate_after(step)
        stepped = any(r.get("kind") == "step" for r in dropped)
        resumed = step if step > 0 or stepped else None
        started = process_started_at()
        self.record.write(acc.attempt_row(dropped, resumed, started, acc.launcher_started_at()))
        for row in self.held:
            self.record.write(row)
        self.held = []
