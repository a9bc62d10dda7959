"""One exception tree, mapped to exit statuses in one place (DESIGN.md, convention 4).

Exit status: 0 no error findings, 1 error findings, 2 bad input or usage.
Every message names what is wrong and what to change.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_BAD_INPUT = 2


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


class ResumeMismatchError(BadInputError):
    """The run dir holds a run of a different recipe."""


class NoUsableCheckpoint(TrainguardError):
    """Checkpoints exist but none verifies or loads: a run refuses to start over silently.

    `findings` holds what was found (C107 lists every step and why)."""

    exit_status = EXIT_FINDINGS

    def __init__(self, message: str, fix: str = "", findings: list | None = None) -> None:
        super().__init__(message, fix)
        self.findings = findings or []


class RunHalted(TrainguardError):
    """A guard decided to halt the run (too many rollbacks, an unrecoverable fault)."""

    exit_status = EXIT_FINDINGS


def exit_status_for(exc: BaseException) -> int:
    if isinstance(exc, TrainguardError):
        return exc.exit_status
    return EXIT_BAD_INPUT


class PreflightFailed(TrainguardError):
    """A pre-flight check found an error; training did not start."""

    exit_status = EXIT_FINDINGS
