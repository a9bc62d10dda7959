"""What a failed write says: `write_failure` turns the OSError of a write into the
OutputWriteError (exit 1) that names the path, the reason and what to do. Both writers of run-dir
files use it: `util/atomic.py` (whole files, renamed into place) and `util/nofollow.py` (appends
and moves that never follow a link).
"""

from __future__ import annotations

import errno
from pathlib import Path

from trainguard.errors import OutputWriteError

_FIXES = {
    errno.ENOSPC: "free disk space, or write to another disk",
    errno.EFBIG: "free disk space or raise the file size limit (ulimit -f)",
    errno.EDQUOT: "free space within your disk quota, or write to another disk",
    errno.EROFS: "the file system is read-only: write to another folder",
    errno.EACCES: "write to a folder you can write to, or fix its permissions",
    errno.EPERM: "write to a folder you can write to (it may be immutable or protected)",
    errno.EISDIR: "a folder is in the way: give a file name, or move the folder aside",
    errno.ENOTDIR: "a file is in the way of a folder on that path: give another path",
    errno.EEXIST: "a file is in the way of a folder on that path: give another path",
}


def write_failure(path: str | Path, exc: OSError) -> OutputWriteError:
    """The OutputWriteError for a failed write of `path`: the reason and what to do."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    fix = _FIXES.get(exc.errno or 0, "check the path, the disk space and the permissions")
    return OutputWriteError(f"cannot write {path}: {reason}; nothing was written there", fix)
