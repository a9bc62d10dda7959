"""The costs a `trainguard run` dir recorded, as medians, for `trainguard plan --run`.

A run record holds each step row's `step_time_s` and the timing rows of goodput accounting
(`goodput/accounting.py`): each save's stall (the loop blocked in the save, and the part of the
next step spent waiting for its background copy), each save's time from its start until its
manifest was written (durable), and each restart (the last record of the dead process to the
first resumed step). A record without timing rows (written before them) gives the stall as the
extra time between the row of a checkpoint step and the next step row, less the median of that
gap after ordinary steps (pairs with any other row between them are skipped), and no write or
restart time: those come from flags, or the write time is taken equal to the stall.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.config.load import RECIPE_FILE, read_run_recipe
from trainguard.config.schema import CheckpointConfig
from trainguard.errors import BadInputError
from trainguard.goodput.accounting import Goodput, account
from trainguard.metrics.jsonl import METRICS_FILE
from trainguard.metrics.record_read import read_record

MIN_STALL_S = 1e-3  # below the clock's use here: a stall measured smaller is reported as this


@dataclass
class Measured:
    """Medians read from a run dir; None where the record holds nothing to measure."""

    step_s: float | None = None
    stall_s: float | None = None
    write_s: float | None = None
    restart_s: float | None = None
    gpus: int | None = None
    interval_steps: int | None = None  # the run's checkpoint.interval
    notes: dict[str, str] = field(default_factory=dict)  # how each number was measured

    def found(self) -> dict[str, tuple[float, str]]:
        """{input name: (value, how it was measured)} for `plan.resolve_inputs`."""
        pairs = {
            "step_time_s": self.step_s,
            "checkpoint_stall_s": self.stall_s,
            "checkpoint_write_s": self.write_s,
            "restart_s": self.restart_s,
            "gpus": self.gpus,
        }
        return {k: (float(v), self.notes[k]) for k, v in pairs.items() if v is not None}


def _number(v: Any) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _checkpoint_interval(run_dir: Path) -> int:
    recipe = read_run_recipe(run_dir)
    section = recipe.get("checkpoint") if isinstance(recipe, dict) else None
    interval = section.get("interval") if isinstance(section, dict) else None
    if isinstance(interval, int) and not isinstance(interval, bool) and interval >= 1:
        return interval
    return int(CheckpointConfig.model_fields["interval"].default)


def _gaps(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step k, seconds between the end of step k and the end of step k + 1) for each pair of
    step rows with nothing logged between them: an evaluation, a finding (a resume logs C150
    before its first step) or an event (start, rollback) between two steps is time the model
    does not take for a save."""
    out: list[tuple[int, float]] = []
    prev: tuple[int, float] | None = None
    for r in rows:
        at = _number(r.get("time")) if r.get("kind") == "step" else None
        step = r.get("step")
        if at is not None and isinstance(step, int) and prev is not None and step == prev[0] + 1:
            out.append((prev[0], at - prev[1]))
        prev = (step, at) if at is not None and isinstance(step, int) else None
    return out


def _from_timing(out: Measured, goodput: Goodput) -> None:
    """The stall, write and restart times of the timing rows (goodput accounting)."""
    stalls = goodput.checkpoint_stalls
    if stalls:
        out.stall_s = max(statistics.median(stalls), MIN_STALL_S)
        out.notes["checkpoint_stall_s"] = (
            f"median stall of {len(stalls)} saves (the save in the loop and the wait for its "
            f"copy) in the timing rows of {METRICS_FILE}"
        )
    writes = goodput.checkpoint_writes
    if writes and out.stall_s is not None:
        # Never below the stall: a synchronous save is durable when its stall ends.
        out.write_s = max(statistics.median(writes), out.stall_s)
        out.notes["checkpoint_write_s"] = (
            f"median time from a save's start to its manifest of {len(writes)} saves in the "
            f"timing rows of {METRICS_FILE}"
        )
    restarts = [r.downtime_s + r.startup_s for r in goodput.restarts]
    if restarts:
        out.restart_s = max(statistics.median(restarts), MIN_STALL_S)
        out.notes["restart_s"] = (
            f"median of {len(restarts)} restarts (the last record of the ended process to the "
            f"first resumed step) in {METRICS_FILE}"
        )


def _stall_from_gaps(out: Measured, rows: list[dict[str, Any]], interval: int) -> None:
    """A record without timing rows: the stall as the extra gap after checkpoint steps."""
    ordinary, saved = [], []
    for k, gap in _gaps(rows):
        (saved if (k + 1) % interval == 0 else ordinary).append(gap)  # k counts from 0
    if ordinary and saved:
        stall = statistics.median(saved) - statistics.median(ordinary)
        out.stall_s = max(stall, MIN_STALL_S)
        out.notes["checkpoint_stall_s"] = (
            f"median extra time after {len(saved)} checkpoint steps (every {interval}) over "
            f"{len(ordinary)} ordinary steps in {METRICS_FILE}"
            + (f"; below {MIN_STALL_S} s, taken as {MIN_STALL_S} s" if stall < MIN_STALL_S else "")
        )


def require_run_dir(run_dir: Path) -> None:
    if not run_dir.exists():
        raise BadInputError(
            f"--run {run_dir} does not exist",
            "give the run dir of a `trainguard run` (its --run-dir), or drop --run and give "
            "the numbers as flags",
        )
    if not run_dir.is_dir() or not (run_dir / RECIPE_FILE).is_file():
        raise BadInputError(
            f"--run {run_dir} is not a run dir: it has no {RECIPE_FILE}",
            "give the run dir of a `trainguard run` (the folder holding recipe.yaml and "
            "metrics.jsonl), or drop --run and give the numbers as flags",
        )


def measure_run(run_dir: Path) -> Measured:
    """The median step time, checkpoint stall and world size `run_dir` recorded."""
    require_run_dir(run_dir)
    rows = read_record(run_dir).rows  # steps from 0, whichever release wrote them
    out = Measured()
    times = [
        t
        for r in rows
        if r.get("kind") == "step" and (t := _number(r.get("step_time_s"))) is not None and t > 0
    ]
    if times:
        out.step_s = statistics.median(times)
        out.notes["step_time_s"] = f"median step_time_s of {len(times)} steps in {METRICS_FILE}"
    interval = out.interval_steps = _checkpoint_interval(run_dir)
    goodput = account(rows)
    if goodput.recorded:
        _from_timing(out, goodput)
    else:
        _stall_from_gaps(out, rows, interval)
    start = next((r for r in rows if r.get("kind") == "event" and r.get("event") == "start"), None)
    env = (start or {}).get("env")
    world = env.get("world_size") if isinstance(env, dict) else None
    if isinstance(world, int) and not isinstance(world, bool) and world >= 1:
        out.gpus = world
        out.notes["gpus"] = f"world_size of the start event in {METRICS_FILE}"
    return out
