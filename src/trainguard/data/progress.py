"""Progress of a long data phase: a rich bar on a terminal, else a few plain lines on stderr."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """A rich bar on a terminal, else a few plain lines on stderr; nothing when disabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None
        self.t0 = time.perf_counter()
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(console=Console(stderr=True), transient=True)
            self.bar.start()
        self.task: Any = None

    def phase(self, text: str, total: float | None = None) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            if self.task is not None:
                self.bar.remove_task(self.task)
            from rich.markup import escape

            # The description column reads markup: the text quotes the source path.
            self.task = self.bar.add_task(escape(text), total=total)
        else:
            print(f"trainguard data: {text}", file=sys.stderr, flush=True)

    def advance(self, n: float) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.advance(self.task, n)

    def close(self, text: str) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self.enabled:
            took = time.perf_counter() - self.t0
            print(f"trainguard data: {text} ({took:.1f} s)", file=sys.stderr, flush=True)
