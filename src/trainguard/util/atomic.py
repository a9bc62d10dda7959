"""Crash-safe file writes: write to a temporary name, flush to disk, rename.

Temporary files and folders get unpredictable names from `tempfile.mkstemp`/`mkdtemp` in the
target folder (created with O_CREAT|O_EXCL, and O_NOFOLLOW): a symlink planted under a
guessable name is never followed, so nothing outside the target is ever written.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def fsync_dir(path: str | Path) -> None:
    """Make a rename durable: fsync the directory holding it (no-op where unsupported)."""
    with contextlib.suppress(OSError):
        fd = os.open(str(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def current_umask() -> int:
    """The process umask, read without changing it where the kernel tells it (Linux)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: set and restore (not thread-safe, but rare)
    os.umask(mask)
    return mask


def make_temp_dir(parent: str | Path, prefix: str, suffix: str = "") -> Path:
    """A new, empty folder under `parent` with an unpredictable name and the permissions a
    plain mkdir would give (mkdtemp's are 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
    os.chmod(path, 0o777 & ~current_umask())
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~current_umask())  # what open(path, "wb") gives
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
