"""One exception tree, mapped to exit statuses in one place (DESIGN.md, convention 4).

The exit table, for every command (README, "Commands"):

    0    success: a check found no error; `run` finished (faults its guards handled are findings)
    1    error findings; `run`: a guard halted it, pre-flight failed, no checkpoint is usable
         (C107), or its data changed (D104)
    2    bad input or usage (the message names the problem and the fix); nothing was started
    3    `run`: the hang watchdog stopped a stuck step (run the same command again to resume)
    130  interrupted by Ctrl-C (SIGINT), 128 + 2 as a shell reports it
    143  terminated by SIGTERM (a scheduler's stop), 128 + 15, handled like Ctrl-C

Every message names what is wrong and what to change.
"""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_BAD_INPUT = 2
EXIT_HANG = 3
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM


class TrainguardError(Exception):
    """Base of every error trainguard raises on purpose."""

    exit_status = EXIT_BAD_INPUT

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

    exit_status = EXIT_FINDINGS


class ResumeMismatchError(BadInputError):
    """The run dir holds a run of a different recipe."""


class NoUsableCheckpoint(TrainguardError):
    """Checkpoints exist but none verifies or loads: a run refuses to start over silently.

    `findings` holds what was found (C107 lists every step and why)."""

    exit_status = EXIT_FINDINGS

    def __init__(self, message: str, fix: str = "", findings: list | None = None) -> None:
        super().__init__(message, fix)
        self.findings = findings or []


class RunDirBusyError(BadInputError):
    """Another live process holds the folder's lock (`util/runlock.py`)."""


class RunHalted(TrainguardError):
    """A guard decided to halt the run (too many rollbacks, an unrecoverable fault), or a resume
    stopped because the data changed since the checkpoint (D104)."""

    exit_status = EXIT_FINDINGS


class RunHung(TrainguardError):
    """The hang watchdog stopped a stuck step. Never raised: the process exits from the
    watchdog's thread (monitors/watchdog.py); this names the outcome in a run's result."""

    exit_status = EXIT_HANG


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM arrived: the command stops as after Ctrl-C, with exit status
    130 or 143. A KeyboardInterrupt, so that no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_status = 128 + signum
        self.message = f"interrupted by {signal.Signals(signum).name}"
        self.fix = "run the same command again to continue (a run resumes from its last checkpoint)"
        super().__init__(self.message)


def exit_status_for(exc: BaseException) -> int:
    """The exit status `exc` ends a command with (the table above)."""
    if isinstance(exc, TrainguardError | Interrupted):
        return exc.exit_status
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_FINDINGS  # an unexpected exception: the interpreter's status after a traceback


class PreflightFailed(TrainguardError):
    """A pre-flight check found an error; training did not start."""

    exit_status = EXIT_FINDINGS
