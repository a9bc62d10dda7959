"""Crash-safe file writes: write to a temporary name in the target folder, flush, rename.

Every output file trainguard writes goes through `atomic_paths` (or `atomic_write_bytes` /
`atomic_write_text`, built on it): the data is written to an unpredictable temporary name in
the target's folder (`tempfile.mkstemp`/`mkdtemp`: O_CREAT|O_EXCL, and O_NOFOLLOW, so a symlink
planted under a guessable name is never followed and nothing outside the target is written),
flushed to disk and renamed onto the target only when everything succeeded; a target that
is a symbolic link is refused (`util/nofollow.py`: LinkRefused, exit 1), never written
through nor silently replaced. A failed write
(disk full, read-only folder, a folder where the file goes) leaves no partial output behind and
raises `OutputWriteError` naming the path (exit 1).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.util.nofollow import refuse_link
from trainguard.util.write_errors import write_failure


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


def check_writable(path: str | Path, *, folder: bool = False) -> Path:
    """Fail now, before any expensive work, if the file (or with `folder`, the folder) `path`
    clearly cannot be written.

    Catches a folder where the file goes, a file where a folder goes, and a folder that refuses
    new files (read-only, immutable). Creates nothing: the probe file is removed again. A disk
    that fills up later is still caught by the write itself.
    """
    path = Path(path)
    if path.is_dir() and not folder:
        raise write_failure(path, IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)))
    if folder and path.exists() and not path.is_dir():
        raise write_failure(path, NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)))
    return _probe(path, path if folder and path.is_dir() else path.parent)


def _probe(path: Path, folder: Path) -> Path:
    """Create and remove a file in `folder` (or its nearest existing ancestor); errors name
    `path`, the output the user gave."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise write_failure(path, NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)))
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe-")
    except OSError as e:
        raise write_failure(path, e) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return path


def _failed_target(exc: OSError, pairs: list[tuple[Path, Path]]) -> Path | str | None:
    """The target an OSError is about; None when it names some other file (not a write)."""
    named = {str(exc.filename), str(exc.filename2)} - {"None"}
    if not named:
        return pairs[0][1] if len(pairs) == 1 else ", ".join(str(t) for _, t in pairs)
    for tmp, target in pairs:
        if named & {str(tmp), str(target), str(target.parent)}:
            return target
    return None


@contextlib.contextmanager
def atomic_paths(*targets: str | Path) -> Iterator[list[Path]]:
    """Temporary paths beside `targets`, renamed onto them only when the block succeeds.

    The temporary names keep the target's name and suffix (matplotlib and pyarrow pick the
    format from it). Each lives in a private folder (`mkdtemp`: mode 0700, an unpredictable
    name) beside its target, so nobody else can swap it for a link between the block's write
    and the rename; the commit still opens it with O_NOFOLLOW|O_NONBLOCK and takes its mode,
    fsync and type from that descriptor, never from the name. Anything the block raises removes
    every temporary file and folder; an OSError about them becomes an OutputWriteError naming
    the target.
    """
    paths = [Path(t) for t in targets]
    pairs: list[tuple[Path, Path]] = []
    private: list[Path] = []  # one 0700 folder per temporary file
    made: list[Path] = []  # folders created here, removed again (when empty) on failure
    current = paths[0] if paths else None
    committed = False
    try:
        for target in paths:
            current = target
            # The rename would replace a link, not write its target; a link where an output
            # belongs is refused all the same (util/nofollow.py says why).
            refuse_link(target)
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
            made += reversed([d for d in (target.parent, *target.parent.parents) if not d.exists()])
            target.parent.mkdir(parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
            private.append(folder)
            pairs.append((folder / target.name, target))
        yield [tmp for tmp, _ in pairs]
        for tmp, target in pairs:
            mode = target.stat().st_mode & 0o7777 if target.is_file() else 0o666 & ~current_umask()
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):  # the block made a folder or a FIFO
                    raise IsADirectoryError(errno.EISDIR, "not a regular file", str(tmp))
                os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
        for tmp, target in pairs:
            os.replace(tmp, target)
        committed = True
        for folder in {target.parent for _, target in pairs}:
            fsync_dir(folder)
    except OSError as e:
        where = _failed_target(e, pairs) if len(pairs) == len(paths) else current
        if where is None:
            raise
        raise write_failure(where, e) from e
    finally:
        for tmp, _ in pairs:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        for folder in private:
            with contextlib.suppress(OSError):
                folder.rmdir()
        if not committed:
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    folder.rmdir()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_paths(path) as (tmp,):
        # O_CREAT|O_EXCL|O_NOFOLLOW: the temporary name is new, in our private folder.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_copy(source: str | Path, target: str | Path) -> None:
    """Copy the file `source` to `target` as a whole-file write (never through a link)."""
    with atomic_paths(target) as (tmp,):
        shutil.copyfile(source, tmp)


def save_figures(figures: list[Any], paths: list[str | Path], dpi: int = 110) -> None:
    """Write matplotlib figures as whole files (all or none, never through a link) and close
    them, also when a write fails: every plot trainguard saves goes through here."""
    import matplotlib.pyplot as plt

    try:
        with atomic_paths(*paths) as tmps:
            for fig, tmp in zip(figures, tmps, strict=True):
                fig.savefig(tmp, dpi=dpi)
    finally:
        for fig in figures:
            plt.close(fig)
