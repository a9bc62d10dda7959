"""One exception tree, and the one table of exit statuses it maps to (docs/architecture.md,
convention 4).

The exit table, for every command (README, "Commands"): `ExitStatus`.

    0    OK           success: a check found no error; `run` finished (faults its guards
                      handled are findings)
    1    FINDINGS     error findings; `run`: a guard halted it, pre-flight failed, no checkpoint
                      is usable (C107), its data changed (D104), or (`--nproc`) a worker died
                      (R302; its survivors exit 3); an output could not be written
    2    BAD_INPUT    bad input or usage (the message names the problem and the fix); nothing
                      was started
    3    HANG         `run`: the hang watchdog stopped a stuck step, or a rank hung (run the
                      same command again to resume)
    130  INTERRUPTED  interrupted by Ctrl-C (SIGINT), 128 + 2 as a shell reports it
    143  TERMINATED   terminated by SIGTERM (a scheduler's stop), 128 + 15, handled like Ctrl-C

Each exception class names its status (`exit_status`); `exit_status_for` reads it, and the one
handler that turns an exception into a message and a status is `cli.common.exit_statuses`.
Every message names what is wrong and what to change.
"""

from __future__ import annotations

import signal
from enum import IntEnum


class ExitStatus(IntEnum):
    """The exit statuses of every trainguard command (the table above)."""

    OK = 0
    FINDINGS = 1
    BAD_INPUT = 2
    HANG = 3
    INTERRUPTED = 128 + signal.SIGINT
    TERMINATED = 128 + signal.SIGTERM


def signal_status(signum: int) -> int:
    """The status a process ended by signal `signum` reports (128 + signum, as a shell does):
    `ExitStatus.INTERRUPTED` for SIGINT, `ExitStatus.TERMINATED` for SIGTERM."""
    status = 128 + signum
    return ExitStatus(status) if status in ExitStatus._value2member_map_ else status


class TrainguardError(Exception):
    """Base of every error trainguard raises on purpose."""

    exit_status: int = ExitStatus.BAD_INPUT

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class BadInputError(TrainguardError):
    """The user gave something we cannot use: a recipe, a path, a flag."""


class ConfigError(BadInputError):
    """A recipe or override is invalid; the message names the key and allowed values."""


class DataError(BadInputError):
    """Missing, empty or unreadable data."""


class CorruptError(TrainguardError):
    """A file's checksum or structure does not match its manifest."""


class StorageError(TrainguardError):
    """A write failed (disk full, permission denied, store unreachable); nothing was damaged."""


class OutputWriteError(StorageError):
    """Writing an output file failed (disk full, read-only folder, a folder in the way).

    Exit 1: the input was fine and nothing was damaged, but the command did not produce its
    output. The message names the path; no partial output is left behind (util/atomic.py).
    """

    exit_status = ExitStatus.FINDINGS


class ResumeMismatchError(BadInputError):
    """The run dir holds a run of a different recipe."""


class NoUsableCheckpoint(TrainguardError):
    """Checkpoints exist but none verifies or loads: a run refuses to start over silently.

    `findings` holds what was found (C107 lists every step and why)."""

    exit_status = ExitStatus.FINDINGS

    def __init__(self, message: str, fix: str = "", findings: list | None = None) -> None:
        super().__init__(message, fix)
        self.findings = findings or []


class RunDirBusyError(BadInputError):
    """Another live process holds the folder's lock (`util/runlock.py`)."""


class RunHalted(TrainguardError):
    """A guard decided to halt the run (too many rollbacks, an unrecoverable fault), or a resume
    stopped because the data changed since the checkpoint (D104)."""

    exit_status = ExitStatus.FINDINGS


class RunHung(TrainguardError):
    """The hang watchdog stopped a stuck step. Never raised: the process exits from the
    watchdog's thread (guard/watchdog.py); this names the outcome in a run's result."""

    exit_status = ExitStatus.HANG


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM arrived: the command stops as after Ctrl-C, with exit status
    130 or 143. A KeyboardInterrupt, so that no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_status = signal_status(signum)
        self.message = f"interrupted by {signal.Signals(signum).name}"
        self.fix = "run the same command again to continue (a run resumes from its last checkpoint)"
        super().__init__(self.message)


def exit_status_for(exc: BaseException) -> int:
    """The exit status `exc` ends a command with (the table above)."""
    if isinstance(exc, TrainguardError | Interrupted):
        return exc.exit_status
    if isinstance(exc, KeyboardInterrupt):
        return ExitStatus.INTERRUPTED
    return ExitStatus.FINDINGS  # unexpected: the status the interpreter gives a traceback


class PreflightFailed(TrainguardError):
    """A pre-flight check found an error; training did not start."""

    exit_status = ExitStatus.FINDINGS
