"""What the soak of a user's command (drills/chaos_external.py) reads from the run record its
loop's `Guard(run_dir=...)` writes: the step rows (when a fault is due; the run's length), the
checkpoint root the loop attached (`guard.record.attach(checkpoints=...)`, run.json's
`checkpoints.root`) and the checkpoint interval, so that the user gives nothing twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.errors import BadInputError
from trainguard.metrics.jsonl import read_metrics
from trainguard.metrics.record_read import read_run_info
from trainguard.metrics.rowjson import iter_rows
from trainguard.util.inputs import read_text


def step_rows(run_dir: Path, since: float | None = None) -> list[dict[str, Any]]:
    """The record's step rows (0-based `step`); with `since`, those written from then on."""
    return [
        r
        for r in read_metrics(run_dir)
        if r.get("kind") == "step"
        and isinstance(r.get("step"), int)
        and (since is None or (isinstance(r.get("time"), float) and r["time"] >= since))
    ]


def checkpoint_root(run_dir: Path) -> Path | None:
    """The checkpoint root the record names (relative to the run dir, or absolute); None when
    it names none, or one that is not a local folder."""
    root = (read_run_info(run_dir).get("checkpoints") or {}).get("root")
    if not isinstance(root, str) or not root or "://" in root:
        return None
    path = Path(root)
    return path if path.is_absolute() else run_dir / path


def committed_steps(root: Path) -> list[int]:
    """The steps under `root` with a committed folder (its manifest written last)."""
    from trainguard.checkpoint.manifest import parse_step_dirname

    return sorted(
        s
        for p in (root.iterdir() if root.is_dir() else ())
        if (s := parse_step_dirname(p.name)) is not None and (p / "manifest.json").is_file()
    )


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file a guard appends to (guard.jsonl): bounded, a torn last
    line left out; [] when there is none."""
    if not path.is_file():
        return []
    text = read_text(path, "findings log", "restore it, or run the soak in a new --workdir")
    return [row for _, row, _ in iter_rows(text) if row is not None]


def plan_of(run_dir: Path, returncode: int, log: Path) -> tuple[int, int]:
    """(steps, checkpoint interval) of the fault-free reference run in `run_dir`: its last step
    row + 1, and the spacing of its saves (the record's checkpoint rows; else the committed
    step folders). BadInputError when the run failed or its record cannot say."""
    fix = "run the command by hand with an empty folder for {run_dir}, and see that it ends"
    if returncode != 0:
        raise BadInputError(
            f"the fault-free reference run of --command exited {returncode} (its output: {log})",
            f"{fix} with status 0: the soak compares every run with this one",
        )
    rows = step_rows(run_dir)
    if not rows:
        raise BadInputError(
            f"the reference run of --command wrote no step rows to {run_dir}/metrics.jsonl",
            "give the loop's Guard run_dir={run_dir} (trainguard.Guard(run_dir=...)): the soak "
            "times its faults by that record",
        )
    steps = max(r["step"] for r in rows) + 1
    saved = {
        r["step"]
        for r in read_metrics(run_dir)
        if r.get("kind") == "timing"
        and r.get("what") == "checkpoint"
        and isinstance(r.get("step"), int)
    }
    root = checkpoint_root(run_dir)
    if root is not None and not Path(root).resolve().is_relative_to(Path(run_dir).resolve()):
        raise BadInputError(
            f"the reference run of --command keeps its checkpoints in {root}, outside its "
            f"run dir {run_dir}: every run of the soak would resume from the same ones (and a "
            "corrupt fault would damage them)",
            "put the checkpoints under {run_dir} (e.g. Checkpointer(run_dir / 'checkpoints'))",
        )
    if not saved and root is not None:
        saved = set(committed_steps(root))
    points = sorted(s for s in saved if 0 < s < steps) or sorted(s for s in saved if s > 0)
    if root is None or not points:
        raise BadInputError(
            f"the reference run of --command saved no checkpoint its record names ({run_dir})",
            "attach the Checkpointer's root to the record (guard.record.attach(checkpoints="
            "checkpointer.root)) and save every few steps: the soak resumes from them",
        )
    gaps = [b - a for a, b in zip([0, *points], points, strict=False)]
    return steps, min(gaps)
