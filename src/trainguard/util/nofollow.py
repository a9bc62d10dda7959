"""Writing and moving files in a folder someone else may have prepared, never through a link.

A run dir (or a checkpoint root) is shared ground: anyone who can write it can plant
`metrics.jsonl -> ~/.bashrc` or `checkpoints/quarantine -> /elsewhere`. Following such a link
would append training rows to the target, overwrite it with a tokenizer, or move a damaged
checkpoint out of the run. So every file trainguard writes in such a folder goes through here
(or through `util/atomic.py`, whose rename replaces a path and which refuses a link there):

- `open_append` / `open_truncate`: O_NOFOLLOW (a link is refused, not followed) and O_NONBLOCK
  (a FIFO cannot block the open), then fstat: only a regular file is written;
- `refuse_link`: the check a whole-file replace makes first (the rename would replace the
  link itself: safe, but a link where a trainguard file belongs is an error worth saying);
- `move_within`: a rename inside one folder whose destination folders are reached from it one
  component at a time with O_NOFOLLOW (dir fds), so nothing is moved out through a link.

A link found where a trainguard file belongs raises `LinkRefused` (an OutputWriteError, exit 1:
the output could not be written) naming the path, the link's target and the fix; `refused_links`
lists them up front so a command can refuse before it starts (exit 2).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from trainguard.errors import BadInputError, OutputWriteError
from trainguard.util.write_errors import write_failure


class LinkRefused(OutputWriteError):
    """A symlink (or a FIFO, device, socket) where trainguard writes a file or a folder."""


def _target(path: Path) -> str:
    with contextlib.suppress(OSError):
        return os.readlink(path)
    return "?"


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def link_message(path: Path, mode: int | None = None, action: str = "write") -> tuple[str, str]:
    """(message, fix) for a link or special file at `path`, where trainguard writes."""
    mode = os.lstat(path).st_mode if mode is None else mode
    what = _kind(mode)
    if stat.S_ISLNK(mode):
        what += f" (to {_target(path)})"
    return (
        f"cannot {action} {path}: it is {what}; trainguard never writes or moves anything "
        "through a link or into a special file, so nothing was written there",
        f"move {path} aside (or replace the link with a real file or folder), or use "
        "another folder",
    )


def refuse_link(path: str | Path) -> None:
    """LinkRefused if `path` is a symbolic link or a special file (FIFO, device, socket), which
    reading could block on; a regular file, a folder or nothing at all pass."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise LinkRefused(*link_message(path, mode))


def refused_links(folder: str | Path, names: Iterable[str]) -> list[Path]:
    """The entries `folder/name` (names may hold '/') that are symbolic links or special
    files: a command refuses them before it starts. A missing entry is fine."""
    found = []
    for name in names:
        path = Path(folder) / name
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            found.append(path)
    return found


def refuse_links_before_start(folder: str | Path, names: Iterable[str], what: str) -> None:
    """BadInputError (exit 2: nothing was started) naming the first entry `refused_links`
    finds."""
    bad = refused_links(folder, names)
    if bad:
        message, fix = link_message(bad[0])
        raise BadInputError(f"{what}: {message}", fix)


def _open(path: Path, flags: int) -> int:
    # O_NONBLOCK: opening a FIFO for writing without a reader fails (ENXIO) instead of
    # blocking; with one, the fstat below refuses it. It changes nothing for a regular file.
    flags |= os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EMLINK):
            raise LinkRefused(*link_message(path)) from None
        raise write_failure(path, e) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise LinkRefused(*link_message(path, mode))
    os.set_blocking(fd, True)
    return fd


def _opener(path: str, flags: int) -> int:
    return _open(Path(path), flags)


def open_append(path: str | Path) -> TextIO:
    """`path` opened for appending text (created if absent), never through a link."""
    return open(path, "a", encoding="utf-8", opener=_opener)


def open_truncate(path: str | Path) -> TextIO:
    """`path` opened for writing text from empty (created if absent), never through a link."""
    return open(path, "w", encoding="utf-8", opener=_opener)


@contextlib.contextmanager
def _walk_dirs(root: Path, parts: list[str], create: bool) -> Iterator[int]:
    """An fd of `root/parts...`, each component a real folder (created when `create`) reached
    without following a link; LinkRefused naming the first that is not."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        here = root
        for part in parts:
            here = here / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            try:
                nfd = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise LinkRefused(*link_message(here, action="move into")) from None
                raise
            os.close(fd)
            fd = nfd
        yield fd
    finally:
        os.close(fd)


def move_within(root: str | Path, source: str, dest: str) -> Path:
    """Rename `root/source` (one entry of `root`) to `root/dest` or, if taken, `dest.1`,
    `dest.2`, ...; the folders on the way to it are created as needed. Nothing leaves `root`:
    each of those folders must be a real folder, not a link (LinkRefused). Returns the path
    it was moved to. Nothing is replaced or deleted."""
    root = Path(root)
    *folders, name = dest.split("/")
    with (
        _walk_dirs(root, [], create=False) as src_fd,
        _walk_dirs(root, folders, create=True) as dst_fd,
    ):
        candidate, n = name, 0
        while True:
            try:
                os.stat(candidate, dir_fd=dst_fd, follow_symlinks=False)
            except FileNotFoundError:
                break
            n += 1
            candidate = f"{name}.{n}"
        os.rename(source, candidate, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        with contextlib.suppress(OSError):  # durable where the file system supports it
            os.fsync(dst_fd)
            os.fsync(src_fd)
    return root.joinpath(*folders, candidate)
