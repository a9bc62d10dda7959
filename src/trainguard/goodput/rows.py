"""The `timing` rows of goodput accounting (`goodput/accounting.py`, docs/goodput.md): their
format, and the builders `trainguard run` (`train/callbacks/goodput.py`) and a user's loop write
them with.

    {"kind": "timing", "what": "attempt", "time", "process_start", "launcher_start", "lost"}
        a process joins the run (no `step`: a resume's cut never drops it); `lost` is what the
        cut of this resume drops: {"steps": step rows, "until": the last time they recorded}
    {"kind": "timing", "what": "first_step", "time"}
        the process's first step began (no `step`: it outlives a later cut of that step)
    {"kind": "timing", "what": "checkpoint" | "eval", "step", "seconds", "time"}
        a save's stall in the loop, an evaluation (`time`: its end)
    {"kind": "timing", "what": "copy_wait", "step", "seconds"}
        the part of a checkpoint stall spent inside step `step` (the background copy)
    {"kind": "timing", "what": "write", "step", "seconds"}
        a save's start to its checkpoint being durable (its manifest written)
    {"kind": "timing", "what": "end", "step", "time"}
        the process is done (finished, or ending with an error)

"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from trainguard.metrics.jsonl import lost_on_resume
from trainguard.util.processes import process_started_at
from trainguard.util.runlock import HOLDER_ENV

TIMING = "timing"


def attempt_row(
    rows: list[dict[str, Any]],
    resumed_step: int | None,
    process_start: float | None,
    launcher_start: float | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The row a process writes when it joins the run, with what a resume's cut of the log at
    `resumed_step` drops (`MetricsLog.truncate_after`, by its rule `lost_on_resume`): `rows`
    is the log before the cut, or only the rows the cut returned (the same row: the cut
    reads the log once). `lost.until` is the last time a dropped row recorded (None when
    none did: the last kept row, where accounting's walk already stands)."""
    now = time.time() if now is None else now
    lost = None
    if resumed_step is not None:
        dropped = [r for r in rows if lost_on_resume(r, resumed_step)]
        times = [t for r in dropped if (t := _time(r)) is not None]
        lost = {
            "steps": sum(1 for r in dropped if r.get("kind") == "step"),
            "until": max(times) if times else None,
        }
    return {
        "kind": TIMING,
        "what": "attempt",
        "time": now,
        "process_start": process_start if process_start is not None else now,
        "launcher_start": launcher_start,
        "resumed_from": resumed_step,
        "lost": lost,
    }


def launcher_started_at() -> float | None:
    """The start of the process that launched this one for the job (`run --nproc`'s, or the
    elastic agent of a torchrun): a relaunch's restart begins there. None when there is none."""
    holder = os.environ.get(HOLDER_ENV, "")
    if holder.isdigit():
        return process_started_at(int(holder))
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return process_started_at(os.getppid())
    return None


def phase_row(what: str, step: int, seconds: float, end: float) -> dict[str, Any]:
    """A checkpoint stall or an evaluation of `seconds` that ended at wall time `end`."""
    return {"kind": TIMING, "what": what, "step": step, "seconds": seconds, "time": end}


def first_step_row(start: float) -> dict[str, Any]:
    """The process's first step began at wall time `start` (no `step`: kept when a later
    resume's cut drops that step, so the restart before it is still known)."""
    return {"kind": TIMING, "what": "first_step", "time": start}


def copy_wait_row(step: int, seconds: float) -> dict[str, Any]:
    return {"kind": TIMING, "what": "copy_wait", "step": step, "seconds": seconds}


def write_row(step: int, seconds: float) -> dict[str, Any]:
    return {"kind": TIMING, "what": "write", "step": step, "seconds": seconds}


def end_row(step: int, now: float) -> dict[str, Any]:
    """The process is done at `step` (a resume's cut drops it with the steps after its
    checkpoint: the time up to it was thrown away with them)."""
    return {"kind": TIMING, "what": "end", "step": step, "time": now}


def finite(v: Any) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _time(r: dict[str, Any]) -> float | None:
    if r.get("kind") == "step" or (r.get("kind") == TIMING and r.get("what") != "attempt"):
        return finite(r.get("time"))
    return None
