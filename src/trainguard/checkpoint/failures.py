"""Turn a failed write into words: which errno, and what it means for the run.

Serialisers do not all raise OSError: safetensors (Rust) and torch.save (C++ zip writer) wrap
the failure in their own exception types, sometimes without an errno at all.
`save_failure` is the store's error for a save that failed, `retention_skipped` its warning
when the root could not be listed after a save.
"""

from __future__ import annotations

import errno
import re

from trainguard.errors import StorageError
from trainguard.findings import Finding

_ERRNO_WORDS = {
    errno.ENOSPC: "the disk is full",
    errno.EFBIG: "a file grew past the file size limit (RLIMIT_FSIZE or the file system's)",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a parent of the path is a file, not a folder",
}


# How serialisers that bypass Python's file objects report a failed write: safetensors (Rust)
# says "I/O error: File too large (os error 27)"; torch.save's zip writer says "unexpected pos"
# or "file write failed", with the iostream error as its context.
_IO_PHRASES = ("unexpected pos", "file write failed", "iostream error", "i/o error")
_OS_ERROR_RE = re.compile(r"os error (\d+)")


def io_errno(exc: BaseException) -> int | None:
    """The errno behind a write failure, -1 if it is an I/O failure without one, else None."""
    chain, seen = [exc], set()
    while chain:
        e = chain.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            return e.errno if e.errno is not None else -1
        match = _OS_ERROR_RE.search(str(e))
        if match:
            return int(match.group(1))
        if any(p in str(e).lower() for p in _IO_PHRASES):
            return -1
        chain += [c for c in (e.__cause__, e.__context__) if c is not None]
    return None


def describe(exc: BaseException) -> str:
    """What went wrong in words a user can act on, followed by the original error."""
    code = getattr(exc, "errno", None) or io_errno(exc)
    words = _ERRNO_WORDS.get(code or -1)
    if code == -1:
        words = "a write failed without an error number (a full disk or a file size limit?)"
    text = f"{type(exc).__name__}: {exc}"
    return f"{words} ({text})" if words else text


def failure_text(error: BaseException | None) -> str | None:
    """One line for the other ranks: what failed here, in words (the errno named)."""
    if error is None:
        return None
    failures = getattr(error, "failures", None)  # DCP's CheckpointException: {rank: (exc, tb)}
    if isinstance(failures, dict) and failures:
        return "; ".join(
            f"rank {r}: {describe(exc[0] if isinstance(exc, tuple) else exc)}"
            for r, exc in sorted(failures.items())
        )
    return error.message if isinstance(error, StorageError) else describe(error)


def save_failure(
    step: int, action: str, exc: BaseException, location: str, remote: bool, earlier: list[int]
) -> StorageError:
    """The error of a save that failed at `action` ("write", "commit", ...) of step `step` at
    `location`: what happened to the partial step, and that the newest of the `earlier` steps
    is untouched (C106 locally, C201 on object storage)."""
    kept = (
        f"the previous checkpoint (step {earlier[-1]}) is untouched"
        if earlier
        else ("no earlier checkpoint exists")
    )
    code = "C201" if remote else "C106"
    partial = (
        "its manifest was not committed, so the partial step is never loaded"
        if remote
        else "the partial step was removed"
    )
    return StorageError(
        f"{code}: could not {action} checkpoint step {step} at "
        f"{location}: {describe(exc)}; {partial} and {kept}",
        "free disk space or raise the size/quota limit, fix permissions, or point the "
        "checkpoint root at a writable location"
        + ("; check the endpoint, bucket and credentials" if remote else ""),
    )


def retention_skipped(root: str, remote: bool, exc: BaseException) -> Finding:
    """The warning of a save whose root could not be listed afterwards: retention waits."""
    return Finding.of(
        "C201" if remote else "C106",
        f"could not list {root} after the save, so retention was skipped: {describe(exc)}",
        severity="warning",
        where=root,
    )
