"""The hang watchdog: heartbeats from the loop, a learned timeout, a stack dump, an exit.

    wd = Watchdog(run_dir, floor_s=300).start()
    for step in ...:
        with wd.phase("data"): batch = next(it)
        with wd.phase("forward"): ...
        wd.heartbeat(step)

A daemon thread wakes every `poll_s`. When the time since the last heartbeat exceeds the
timeout, max(floor_s, factor * median of the last `window` step times) (or a phase's own floor,
e.g. a long checkpoint write), it writes every thread's stack to RUN_DIR/hang-<time>[-rank<r>].txt,
the R210 finding to the matching .json, and exits the process with ExitStatus.HANG (3) so that
a launcher restarts it and auto-resume brings the run back.

A loop stuck inside C code that holds the GIL stops the watchdog thread too. For that case a
backstop is armed with `faulthandler.dump_traceback_later` (a C thread that needs no GIL): it
fires `backstop_s` after the Python timeout would have, dumps the stacks to
RUN_DIR/hang-backstop-<pid>.txt and exits with status 1 (faulthandler's fixed status).

The heartbeat costs an append and two attribute writes; the timeout arithmetic runs in the
watchdog thread, off the training loop's hot path.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainguard.errors import ExitStatus
from trainguard.findings import Finding
from trainguard.guard.derived_timeouts import derived_timeout
from trainguard.guard.hang_report import main_thread_frame, report_path, write_hang_report
from trainguard.util.nofollow import open_truncate

__all__ = ["PHASES", "Watchdog"]
# "startup" until the first heartbeat, "loop" between phases after it; the rest are set by the loop.
PHASES = (
    "startup",
    "loop",
    "data",
    "forward",
    "backward",
    "optimizer",
    "checkpoint",
    "collective",
    "eval",
)
MIN_STEPS_TO_LEARN = 3


class Watchdog:
    def __init__(
        self,
        run_dir: str | Path,
        floor_s: float = 300.0,
        factor: float = 5.0,
        window: int = 32,
        rank: int | None = None,
        phase_floors: dict[str, float] | None = None,
        poll_s: float | None = None,
        backstop_s: float | None = None,
        exit_status: int = ExitStatus.HANG,
        exit_process: bool = True,
        on_timeout: Callable[[Finding], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if floor_s <= 0:
            raise ValueError("floor_s must be positive")
        self.run_dir = Path(run_dir)
        self.floor_s = float(floor_s)
        self.factor = float(factor)
        self.rank = rank
        self.phase_floors = dict(phase_floors or {})
        self.poll_s = poll_s if poll_s is not None else min(1.0, self.floor_s / 10)
        self.backstop_s = backstop_s if backstop_s is not None else max(30.0, self.floor_s)
        self.exit_status = exit_status
        self.exit_process = exit_process
        self.on_timeout = on_timeout
        self.clock = clock
        self.durations: deque[float] = deque(maxlen=window)
        self.current_phase = "startup"
        self.last_step: int | None = None
        self.last_beat = clock()
        self.fired: Finding | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._backstop_file: Any = None

    @classmethod
    def from_config(cls, run_dir: str | Path, config: Any, **kw: Any) -> Watchdog:
        """From a `GuardsConfig` (its hang_floor_s, hang_factor, hang_window); `kw` overrides."""
        args = {
            "floor_s": config.hang_floor_s,
            "factor": config.hang_factor,
            "window": config.hang_window,
        }
        return cls(run_dir, **{**args, **kw})

    # --- called by the loop (hot path: keep it to a few attribute writes) ----------------------
    def heartbeat(self, step: int) -> None:
        now = self.clock()
        if self.last_step is not None:
            self.durations.append(now - self.last_beat)
        self.last_beat = now
        self.last_step = step
        if self.current_phase == "startup":
            self.current_phase = "loop"

    def set_phase(self, name: str) -> None:
        self.current_phase = name

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        prev = self.current_phase
        self.current_phase = name
        try:
            yield
        finally:
            # After the first step the code between phases is the loop itself, not startup.
            self.current_phase = (
                "loop" if prev == "startup" and self.last_step is not None else prev
            )

    # --- the learned timeout ----------------------------------------------------------------
    def timeout(self) -> float:
        """max(floor, factor * median recent step time), or the current phase's own floor
        (guard/derived_timeouts.py's rule, with the median)."""
        learned = derived_timeout(
            self.durations,
            factor=self.factor,
            q=50,
            floor_s=self.floor_s,
            min_samples=MIN_STEPS_TO_LEARN,
        )
        t = self.floor_s if learned is None else learned
        return max(t, self.phase_floors.get(self.current_phase, 0.0))

    def overdue(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        return now - self.last_beat > self.timeout()

    # --- the thread -------------------------------------------------------------------------
    def start(self) -> Watchdog:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.last_beat = self.clock()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="trainguard-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        self._disarm_backstop()

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            now = self.clock()
            timeout = self.timeout()
            elapsed = now - self.last_beat
            if elapsed > timeout:
                self.fire(elapsed, timeout)
                return
            self._arm_backstop(timeout - elapsed + self.backstop_s)

    def _arm_backstop(self, seconds: float) -> None:
        if self._backstop_file is None:
            path = self.run_dir / f"hang-backstop-{os.getpid()}.txt"
            self._backstop_file = open_truncate(path)  # kept open; never through a link
        faulthandler.dump_traceback_later(seconds, exit=True, file=self._backstop_file)

    def _disarm_backstop(self) -> None:
        if self._backstop_file is None:
            return
        faulthandler.cancel_dump_traceback_later()
        path = Path(self._backstop_file.name)
        self._backstop_file.close()
        self._backstop_file = None
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()

    # --- the timeout ------------------------------------------------------------------------
    def fire(self, elapsed: float, timeout: float) -> Finding:
        """Dump every thread's stack, write the R210 finding, exit (unless exit_process=False)."""
        self._disarm_backstop()  # the Python path got here: the backstop is not needed
        txt = report_path(self.run_dir, self.rank)
        phase, step = self.current_phase, self.last_step
        stuck_at = main_thread_frame()
        finding = Finding.of(
            "R210",
            f"no heartbeat for {elapsed:.1f}s (timeout {timeout:.1f}s) after step {step}: "
            f"stuck in phase {phase!r} at {stuck_at or 'an unknown frame'}",
            step=step,
            rank=self.rank,
            where=phase,
            data={
                "phase": phase,
                "elapsed_s": round(elapsed, 3),
                "timeout_s": round(timeout, 3),
                "stack_file": txt.name,
                "stuck_at": stuck_at,
                "pid": os.getpid(),
                "exit_status": self.exit_status,
            },
        )
        header = (
            f"trainguard hang watchdog: no heartbeat for {elapsed:.1f}s "
            f"(timeout {timeout:.1f}s)\npid {os.getpid()} rank {self.rank} "
            f"last completed step {step} phase {phase}\nstuck at {stuck_at}"
        )
        watchdog_thread = self._thread.ident if self._thread is not None else None
        write_hang_report(txt, header, finding, skip_thread=watchdog_thread)
        self.fired = finding
        if self.on_timeout is not None:
            with contextlib.suppress(Exception):
                self.on_timeout(finding)
        if self.exit_process:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.exit_status)
        return finding


def remove_unused_backstops(run_dir: str | Path) -> None:
    """Remove the empty backstop files of processes killed while their watchdog was armed (a
    SIGKILL; SIGTERM's default action in a torchrun worker). Call it only while no watchdog of
    `run_dir` runs: under the run dir's lock, before training starts or after the job ended."""
    for path in Path(run_dir).glob("hang-backstop-*.txt"):
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:  # armed, never written: a dump is evidence, kept
                path.unlink()
