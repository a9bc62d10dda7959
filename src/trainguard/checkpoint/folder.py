"""Reading a local step folder without trusting it.

A step folder is data someone else may have written. Every file is opened relative to the
folder one path component at a time with O_NOFOLLOW, so no symlink below the folder is ever
followed; each component is lstat'ed first, so a device, FIFO or socket is never even opened
(opening some devices has side effects, reading /dev/zero never ends); and at most the size
the manifest records is read. The manifest itself is read the same way, with a size cap.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import xxhash

from trainguard.checkpoint.manifest import MANIFEST, UnsafeEntry, check_files, parse_manifest
from trainguard.findings import Finding
from trainguard.util.hashing import CHUNK

# A manifest lists a few files with a size and a checksum each; anything this large is not one.
MANIFEST_MAX_BYTES = 16 << 20

_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
    stat.S_IFSOCK: "a socket",
}


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def open_entry(folder: Path, name: str) -> int | None:
    """A read-only fd of `folder/name`, a regular file reached without following any symlink
    below `folder`; None if it does not exist; UnsafeEntry if it (or a folder on the way) is a
    symlink, device, FIFO or socket. `name` must already have passed `entry_problem`."""
    parts = name.split("/")
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                mode = os.stat(part, dir_fd=dfd, follow_symlinks=False).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return None
            if not last and stat.S_ISREG(mode):
                return None  # a file where a folder should be: the entry does not exist
            if not (stat.S_ISREG(mode) if last else stat.S_ISDIR(mode)):
                raise UnsafeEntry(_kind(mode))
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            flags |= (os.O_NONBLOCK | os.O_NOCTTY) if last else os.O_DIRECTORY
            try:
                fd = os.open(part, flags, dir_fd=dfd)
            except (FileNotFoundError, NotADirectoryError):
                return None  # replaced since the lstat
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise UnsafeEntry("a symbolic link") from None
                raise
            os.close(dfd)
            dfd = fd
        mode = os.fstat(dfd).st_mode
        if not stat.S_ISREG(mode):  # replaced since the lstat
            raise UnsafeEntry(_kind(mode))
        fd, dfd = dfd, -1
        return fd
    finally:
        if dfd >= 0:
            os.close(dfd)


def fd_checksum(fd: int, limit: int) -> str:
    """xxh3-128 of at most `limit` bytes read from `fd` from its start."""
    h, left = xxhash.xxh3_128(), limit
    while left > 0:
        chunk = os.pread(fd, min(CHUNK, left), limit - left)
        if not chunk:
            break
        h.update(chunk)
        left -= len(chunk)
    return h.hexdigest()


def read_manifest(folder: Path) -> bytes | None:
    """The manifest's bytes (at most MANIFEST_MAX_BYTES + 1), None if absent; UnsafeEntry if
    it is not a regular file."""
    fd = open_entry(folder, MANIFEST)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(MANIFEST_MAX_BYTES + 1)


def inspect_local_folder(
    folder: Path, step: int, full: bool = True
) -> tuple[dict[str, Any] | None, list[Finding]]:
    """(the manifest if it parses, findings): manifest, then every file's type, size and (if
    `full`) checksum. Nothing outside `folder` is read, nor more than a file's listed size."""
    try:
        raw = read_manifest(folder)
    except UnsafeEntry as e:
        return None, [
            Finding.of(
                "C109",
                f"checkpoint step {step}: {MANIFEST} is {e}, not a regular file; it was not read",
                step=step,
                where=str(folder),
                data={"file": MANIFEST, "kind": str(e)},
            )
        ]
    if raw is not None and len(raw) > MANIFEST_MAX_BYTES:
        raw = b"\xff"  # not UTF-8: reported as an unreadable manifest (C104)
    manifest, findings = parse_manifest(raw, step, str(folder))
    if manifest is None:
        return None, findings
    current: dict[str, int] = {}  # one file open at a time: check_files asks size, then checksum

    def close() -> None:
        for fd in current.values():
            os.close(fd)
        current.clear()

    def size_of(name: str) -> int | None:
        close()
        fd = open_entry(folder, name)
        if fd is None:
            return None
        current[name] = fd
        return os.fstat(fd).st_size

    def checksum_of(name: str, size: int) -> str:
        return fd_checksum(current[name], size)

    try:
        return manifest, check_files(manifest, size_of, checksum_of if full else None, str(folder))
    finally:
        close()


def verify_local_folder(folder: Path, step: int, full: bool = True) -> list[Finding]:
    """Verify a local step folder: manifest, then every file's size and (if `full`) checksum."""
    return inspect_local_folder(folder, step, full)[1]
