"""The goodput timing rows of a user's loop (`goodput/rows.py`), written into its run record by
the `Guard` (`guard.record`, metrics/record.py) so that any loop's record is accounted like
`trainguard run`'s: start-up, restarts, steps redone after a crash, checkpoint stalls, evals.

The loop says nothing extra. A process joins the record at its first step: the step index it
computes first is where it resumed. There the log is cut as a resume of `trainguard run` cuts
it (`MetricsLog.truncate_after`: the rows of the steps this process recomputes), and an
`attempt` row says what the cut dropped. A process that starts at step 0 is a fresh start: a
log already there (a reused folder, or a process that died before its first checkpoint) is
kept aside as metrics.earlier.jsonl, never cut. Only global rank 0 writes (RecordWriter).

Rows the loop logs before its first step (a checkpoint passed over at load, C101) wait for
that cut: written before it they would speak of a step past the resume and be dropped with
the crashed attempt's rows; written after the attempt row they belong to this process's
start. A process killed before its first step loses them here (guard.jsonl has them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from trainguard.goodput import rows as acc
from trainguard.metrics.record import RecordWriter
from trainguard.util.nofollow import move_within, refuse_link
from trainguard.util.processes import process_started_at

logger = logging.getLogger(__name__)

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
        if not self.record.writes:
            return  # another rank's: global rank 0 writes the record
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
        if self.joined or not self.record.writes:
            self.record.write(row)
        else:
            self.held.append(row)

    def phase(self, name: str, step: int, seconds: float) -> None:
        """A checkpoint save or an evaluation the loop marked with `guard.phase` ended."""
        if name in TIMED_PHASES and self.joined:
            self.record.write(acc.phase_row(name, step, seconds, time.time()))

    def close(self) -> None:
        """The loop is done: its held rows (a process that never stepped) and the end, once
        (the completed steps, as `trainguard run` counts them: a resume from there cuts it
        with the steps after it)."""
        for row in self.held:
            self.record.write(row)
        self.held = []
        if self.joined and self.last_step is not None:
            self.record.write(acc.end_row(self.last_step + 1, time.time()))
            self.last_step = None

    def _join(self, step: int) -> None:
        self.joined = True
        if step > 0:  # a resume: the cut reads the log once
            dropped = self.record.log.truncate_after(step)
            resumed: int | None = step
        else:  # a fresh start: an earlier log is another run's (a reused folder), or the work
            # of a process that died before its first checkpoint; either way it is kept aside
            self._keep_aside()
            dropped, resumed = [], None
        started = process_started_at()
        self.record.write(acc.attempt_row(dropped, resumed, started, acc.launcher_started_at()))
        for row in self.held:
            self.record.write(row)
        self.held = []

    def _keep_aside(self) -> None:
        """An earlier log moved to metrics.earlier.jsonl (.1, .2, ...: nothing replaced)."""
        log = self.record.log
        log.close()
        refuse_link(log.path)  # its target is neither read nor moved
        if log.path.is_file() and log.path.stat().st_size > 0:
            kept = move_within(log.path.parent, log.path.name, f"{log.path.stem}.earlier.jsonl")
            logger.warning("%s held an earlier run's rows: kept as %s", log.path, kept.name)
