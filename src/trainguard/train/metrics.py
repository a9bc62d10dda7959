"""The metric log (`RUN_DIR/metrics.jsonl`) and live progress.

One JSON object per line. Step rows have `"kind": "step"`; evaluation rows `"kind": "eval"`;
findings `"kind": "finding"`; run events (start, resume, end) `"kind": "event"`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from trainguard.findings import Finding
from trainguard.monitors.watchdog import read_hang_reports
from trainguard.util.atomic import atomic_write_text

METRICS_FILE = "metrics.jsonl"


def _json_safe(v: Any) -> Any:
    # JSON has no NaN/Inf; keep them readable and parseable by every JSON reader.
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class MetricsLog:
    """Append-only JSONL writer, flushed per row so a killed run loses at most one line."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / METRICS_FILE
        self._file: TextIO | None = None

    def truncate_after(self, step: int) -> list[dict[str, Any]]:
        """Drop rows of steps after `step` (work a crash threw away); returns the dropped rows.

        A resumed run recomputes those steps, so keeping them would log them twice; the
        dropped step rows' batch hashes let the resumed run prove it replays the same data.
        """
        self.close()  # the file is replaced below; an open handle would write to the old one
        if not self.path.exists():
            return []
        kept, dropped = [], []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by SIGKILL mid-write
            if isinstance(row.get("step"), int) and row["step"] > step:
                dropped.append(row)
            else:
                kept.append(line)
        atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))
        return dropped

    def write(self, row: dict[str, Any]) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        self._file.write(json.dumps({k: _json_safe(v) for k, v in row.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class ProgressDisplay:
    """A live bar (step, loss, tokens/s, ETA) on a terminal; plain periodic lines otherwise."""

    def __init__(self, total_steps: int, start_step: int, log_interval: int, enabled: bool = True):
        self.total = total_steps
        self.log_interval = log_interval
        self.enabled = enabled
        self.interactive = enabled and sys.stderr.isatty() and not os.environ.get("CI")
        self._progress: Progress | None = None
        self._task = None
        self._start_step = start_step
        self._t0 = time.perf_counter()
        if self.interactive:
            self._progress = Progress(
                TextColumn("[bold]step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[tps]} tok/s"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=total_steps, completed=start_step, loss="-", tps="-"
            )

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.update(
                self._task, completed=step, loss=f"{loss:.4f}", tps=f"{tokens_per_s:,.0f}"
            )
        elif step % self.log_interval == 0 or step == self.total:
            done = step - self._start_step
            elapsed = time.perf_counter() - self._t0
            eta = elapsed / max(done, 1) * (self.total - step)
            print(
                f"step {step}/{self.total}  loss {loss:.4f}  {tokens_per_s:,.0f} tok/s  "
                f"eta {eta:.0f}s",
                file=sys.stderr,
                flush=True,
            )

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def unlogged_hang_reports(run_dir: Path) -> list[Finding]:
    """The hang findings in RUN_DIR/hang-*.json that metrics.jsonl does not hold yet.

    A hung process (R210) or hung rank (R301) writes its finding to hang-*.json and exits at
    once; the resume truncation also drops such rows (their step is past the checkpoint), and
    replaying the steps does not hang again. Keyed by stack file, so each hang is logged once
    however often the run resumes, and the log and report keep the run's whole history.
    """
    logged = {
        (row.get("data") or {}).get("stack_file")
        for row in read_metrics(run_dir)
        if row.get("kind") == "finding"
    }
    return [f for f in read_hang_reports(run_dir) if f.data.get("stack_file") not in logged]
