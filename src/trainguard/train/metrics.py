"""Live progress of a run, and the hang reports its log does not hold yet.

The metric log itself (`MetricsLog`, `read_metrics`, `METRICS_FILE`) lives in the low module
`trainguard.metrics.jsonl`, shared with `report` and `watch`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from trainguard.findings import Finding
from trainguard.metrics.jsonl import read_metrics
from trainguard.monitors.hang_report import read_hang_reports


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
