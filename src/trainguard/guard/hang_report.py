"""Hang reports: every thread's stack and the finding, written where a restart finds them.

One writer for the hang watchdog (R210), the hung-rank diagnosis (R301) and the dead-rank
diagnosis (R302): a report is RUN_DIR/hang-<UTC time>[-rank<r>].txt (the stacks) beside a .json
of the same name (the finding), which `read_hang_reports` gives back to the next attempt so that
it logs the hang once. Ranks that the launcher tears down with SIGTERM dump their stacks to
RUN_DIR/stacks-rank<r>-<pid>.txt (`SigtermStackDump`): faulthandler writes from a C signal
handler, so a rank stuck inside a collective still writes.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import threading
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from trainguard.findings import Finding
from trainguard.util.nofollow import open_truncate


def report_path(run_dir: str | Path, rank: int | None = None) -> Path:
    """A new report's stack file: RUN_DIR/hang-<UTC time>[-rank<r>].txt."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    suffix = f"-rank{rank}" if rank is not None else ""
    return Path(run_dir) / f"hang-{stamp}{suffix}.txt"


def main_thread_frame() -> str:
    """Where the main thread is now: 'file:line in function' ('' if unknown)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return ""
    fs = traceback.extract_stack(frame)[-1]
    return f"{fs.filename}:{fs.lineno} in {fs.name}"


def dump_stacks(fh: IO[str], skip_thread: int | None = None) -> None:
    """Every thread's Python stack (but `skip_thread`'s), then faulthandler's view, fsynced."""
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if ident == skip_thread:
            continue
        fh.write(f"--- thread {names.get(ident, '?')} ({ident}) ---\n")
        fh.write("".join(traceback.format_stack(frame)) + "\n")
    fh.write("--- faulthandler (all threads) ---\n")
    fh.flush()
    faulthandler.dump_traceback(file=fh, all_threads=True)
    fh.flush()
    os.fsync(fh.fileno())


def write_hang_report(
    txt: Path, header: str, finding: Finding, skip_thread: int | None = None
) -> None:
    """The stacks into `txt` (under `header`), then the finding into the matching .json.

    The finding's `data["stack_file"]` should name `txt`; the .json is written last, so a
    report that is listed was written whole."""
    with open_truncate(txt) as fh:  # never through a link planted under the name
        fh.write(header.rstrip("\n") + "\n\n")
        dump_stacks(fh, skip_thread)
    with open_truncate(txt.with_suffix(".json")) as fh:
        fh.write(json.dumps(finding.to_dict(), indent=2) + "\n")


def read_hang_reports(run_dir: str | Path) -> list[Finding]:
    """The findings of earlier hangs and dead ranks in `run_dir` (R210, R301, R302), oldest
    first."""
    out = []
    for path in sorted(Path(run_dir).glob("hang-*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            out.append(Finding.from_dict(json.loads(path.read_text(encoding="utf-8"))))
    return out


class SigtermStackDump:
    """While armed, SIGTERM writes every thread's stack to RUN_DIR/stacks-rank<r>-<pid>.txt
    before the process terminates (the signal is chained to the previous handler)."""

    def __init__(self, run_dir: str | Path, rank: int) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self._file: Any = None

    def arm(self) -> None:
        if self._file is not None:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for old in self.run_dir.glob(f"stacks-rank{self.rank}-*.txt"):
            with contextlib.suppress(OSError):
                if old.stat().st_size == 0:  # armed by a killed process, never written
                    old.unlink()
        path = self.run_dir / f"stacks-rank{self.rank}-{os.getpid()}.txt"
        self._file = open_truncate(path)  # kept open while armed; never through a link
        faulthandler.register(signal.SIGTERM, file=self._file, all_threads=True, chain=True)

    def disarm(self) -> None:
        if self._file is None:
            return
        faulthandler.unregister(signal.SIGTERM)
        path = Path(self._file.name)
        self._file.close()
        self._file = None
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()
