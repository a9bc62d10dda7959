"""An exclusive lock on a folder that one command owns while it runs: `FOLDER/.lock`.

`trainguard run` holds its run dir's lock for the life of the run and `scale run` its output
folder's, so two commands never write one folder (checkpoints from one run, `metrics.jsonl`
from the other). The lock is `fcntl.flock` on the file: the kernel releases it when its holder
ends in any way, a SIGKILL included, so a lock left by a killed process is never stale: the next
command simply takes it. The file records its holder (pid, host, start time, command) so that a
refused command can name it; the record is cleared on release.

flock is advisory (only trainguard honours it) and belongs to the open file, not the process:
a second open of the same file is refused even within one process. On NFS, Linux clients
emulate flock with byte-range locks that the server arbitrates, so it holds across machines.

A job of several processes holds the lock once: `run --nproc` takes it in the launching process
and names itself to its workers in HOLDER_ENV; under an external torchrun rank 0 takes it
(`train/rundir.py`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainguard.errors import RunDirBusyError, StorageError

LOCK_FILE = ".lock"
HOLDER_ENV = "TRAINGUARD_LOCK_HOLDER"
"""Set by `run --nproc` for its workers: the pid of the launching process, which holds the lock."""
_MAX_RECORD = 4096


class FolderLock:
    """`with FolderLock(folder, "trainguard run"):` or `.acquire()` ... `.release()`."""

    def __init__(self, folder: str | Path, command: str, flag: str = "--run-dir") -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.command = command
        self.flag = flag  # the option that gives the command another folder
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        """Take the lock without waiting: RunDirBusyError (exit 2) naming the holder when another
        process has it, StorageError when the folder cannot hold a lock file."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_record(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):  # ENOLCK: no locks here
                raise self._storage_error(e) from None
            raise RunDirBusyError(
                f"{self.folder} is in use by {describe(holder)}",
                "wait for it to end or stop it (kill PID stops a run as Ctrl-C does; running the "
                f"command again resumes it), or give this command another folder ({self.flag})",
            ) from None
        self._fd = fd
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": self.command,
        }
        # Informational: a full disk must not stop the lock itself (the run reports the disk).
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)  # the holder record goes first, then the lock
        os.close(self._fd)  # closing the last descriptor releases the flock
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _open(self) -> int:
        # O_NOFOLLOW: a planted symlink is refused, never followed; O_NONBLOCK: a FIFO planted
        # as .lock cannot block the open (it is refused below as not a regular file).
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            raise self._storage_error(e) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise self._storage_error(OSError(errno.EINVAL, "not a regular file"))
        return fd

    def _storage_error(self, e: OSError) -> StorageError:
        reason = os.strerror(e.errno) if e.errno and e.errno != errno.EINVAL else str(e.strerror)
        return StorageError(
            f"cannot lock {self.path}: {reason}",
            f"{LOCK_FILE} must be a regular file trainguard can create in a folder it can "
            f"write; choose such a folder ({self.flag})",
        )


def read_holder(path: str | Path) -> dict[str, Any] | None:
    """The holder record of a lock file; None when none is recorded (free, or just taken)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read_record(fd)
    finally:
        os.close(fd)


def held_by(path: str | Path, pid: int) -> bool:
    """True when the lock file names process `pid` of this host as its holder."""
    holder = read_holder(path) or {}
    return holder.get("pid") == pid and holder.get("host") == socket.gethostname()


def describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process (it has not recorded itself yet)"
    fields = {k: _printable(holder.get(k, "?")) for k in ("pid", "host", "command", "started")}
    return (
        f"pid {fields['pid']} on {fields['host']} ({fields['command']}, started "
        f"{fields['started']})"
    )


def _read_record(fd: int) -> dict[str, Any] | None:
    try:
        text = os.pread(fd, _MAX_RECORD, 0).decode("utf-8", errors="replace")
        record = json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _printable(value: object) -> str:
    # The record is a file anyone could edit: keep what reaches the terminal short and plain.
    return "".join(c if c.isprintable() else "?" for c in str(value))[:120]
