"""Reading a local step folder without trusting it.

A step folder is data someone else may have written. Every file is opened relative to the
folder one path component at a time with O_NOFOLLOW, so no symlink below the folder is ever
followed; each component is lstat'ed first, so a device, FIFO or socket is never even opened
(opening some devices has side effects, reading /dev/zero never ends); and at most the size
the manifest records is read. The manifest itself is read the same way, with a size cap.

A load opens a checkpoint's files through `open_listed` (or `listed_path`, for readers that
take a path) and nothing else: only a name the manifest lists, a regular file inside the
folder of the size listed, in a folder verified before (its checksums). A file the manifest
does not list is never opened, whatever it is (a FIFO would block the load forever, a link
would read a file outside the checkpoint unverified): `RefusedFile` says why, and the loaders
report it as a checkpoint that cannot be loaded (C111), so the step is passed over.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

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


class RefusedFile(Exception):
    """A checkpoint file a load must not read (not listed, not a regular file inside the
    folder, missing, or not the size listed); the message says why, in words."""


def listed_files(folder: Path) -> dict[str, dict[str, Any]]:
    """The `files` table of `folder`'s manifest (self-checksum and names checked);
    RefusedFile when there is no trustworthy one."""
    try:
        raw = read_manifest(folder)
    except UnsafeEntry as e:
        raise RefusedFile(f"the step's {MANIFEST} is {e}, not a regular file") from None
    if raw is None or len(raw) > MANIFEST_MAX_BYTES:
        raise RefusedFile(f"the step folder has no readable {MANIFEST}")
    try:
        step = json.loads(raw.decode("utf-8")).get("step")
    except (UnicodeDecodeError, ValueError, AttributeError):
        step = None
    manifest, findings = parse_manifest(raw, step if isinstance(step, int) else -1, str(folder))
    if manifest is None:
        raise RefusedFile(findings[0].message if findings else f"{MANIFEST} is invalid")
    return manifest["files"]


@contextlib.contextmanager
def open_listed(
    folder: Path, name: str, files: dict[str, dict[str, Any]] | None = None
) -> Iterator[BinaryIO]:
    """`folder/name` open for reading, if `folder`'s manifest (or `files`, its table) lists
    it and it is a regular file inside `folder` of the listed size; else RefusedFile. The one
    way a load opens a checkpoint file (the module docstring says why)."""
    files = listed_files(folder) if files is None else files
    entry = files.get(name)
    if not isinstance(entry, dict):
        raise RefusedFile(f"it is not listed in the step's {MANIFEST}, so it was not read")
    try:
        fd = open_entry(folder, name)
    except UnsafeEntry as e:
        raise RefusedFile(
            f"it is {e}, not a regular file inside the step folder; it was not read"
        ) from None
    if fd is None:
        raise RefusedFile(f"it is listed in the step's {MANIFEST} but missing")
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if size != entry.get("size"):
            raise RefusedFile(
                f"it has {size} bytes, the step's {MANIFEST} says {entry.get('size')}"
            )
        yield f


@contextlib.contextmanager
def listed_path(
    folder: Path, name: str, files: dict[str, dict[str, Any]] | None = None
) -> Iterator[str]:
    """For readers that take a path (safetensors): a path to the file `open_listed` opened.
    Where the system has /proc/self/fd it names that open file, so a name swapped meanwhile
    is not what the reader gets; elsewhere the name checked a moment ago."""
    with open_listed(folder, name, files) as f:
        proc = f"/proc/self/fd/{f.fileno()}"
        yield proc if os.path.exists(proc) else str(folder / name)
