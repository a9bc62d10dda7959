"""The costs a `trainguard run` dir recorded, as medians, for `trainguard plan --run`.

What the record holds today (metrics.jsonl): each step row's `step_time_s` (the step, its data
wait included) and `time` (the wall clock when the step ended). A save happens between the row
of a checkpoint step and the next step, so the stall shows as the extra time between those two
rows: (time[k+1] - time[k]) after a checkpoint step k, less the median of that gap after
ordinary steps; pairs with any other row between them (an evaluation, the findings a resume
logs, a rollback event) are skipped. An asynchronous save's background copy, which the next
step waits for, is counted too. The record holds no write time (when an async save became
durable) and no restart time: those come from flags, or the write time is taken equal to the
stall.
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
from trainguard.metrics.jsonl import METRICS_FILE, read_metrics

MIN_STALL_S = 1e-3  # below the clock's use here: a stall measured smaller is reported as this


@dataclass
class Measured:
    """Medians read from a run dir; None where the record holds nothing to measure."""

    step_s: float | None = None
    stall_s: float | None = None
    gpus: int | None = None
    interval_steps: int | None = None  # the run's checkpoint.interval
    notes: dict[str, str] = field(default_factory=dict)  # how each number was measured

    def found(self) -> dict[str, tuple[float, str]]:
        """{input name: (value, how it was measured)} for `plan.resolve_inputs`."""
        pairs = {"step_time_s": self.step_s, "checkpoint_stall_s": self.stall_s, "gpus": self.gpus}
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
    rows = read_metrics(run_dir)
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
    start = next((r for r in rows if r.get("kind") == "event" and r.get("event") == "start"), None)
    env = (start or {}).get("env")
    world = env.get("world_size") if isinstance(env, dict) else None
    if isinstance(world, int) and not isinstance(world, bool) and world >= 1:
        out.gpus = world
        out.notes["gpus"] = f"world_size of the start event in {METRICS_FILE}"
    return out
