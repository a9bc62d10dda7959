"""Live progress of a run on the terminal (the metric log itself is `trainguard.metrics`)."""

from __future__ import annotations

import os
import sys
import time

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn


class ProgressDisplay:
    """A live bar (step, loss, tokens/s, ETA) on a terminal; plain periodic lines otherwise."""

    def __init__(self, total_steps: int, log_interval: int, enabled: bool = True) -> None:
        self.total = total_steps
        self.log_interval = log_interval
        self.enabled = enabled
        self.interactive = enabled and sys.stderr.isatty() and not os.environ.get("CI")
        self._progress: Progress | None = None
        self._task = None
        self._start_step = 0
        self._t0 = time.perf_counter()

    def start(self, start_step: int) -> None:
        """Training starts (or resumes) at `start_step`: show the bar from there."""
        self._start_step = start_step
        self._t0 = time.perf_counter()
        if self.interactive and self._progress is None:
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
                "train", total=self.total, completed=start_step, loss="-", tps="-"
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
            self._progress.console.print(text, markup=False)  # findings quote user strings
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
