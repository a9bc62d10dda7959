"""A machine-wide cache of fetched files: one fetch per node, shared by every process on it.

Remote checkpoints (checkpoint/remote.py) and prepared data shards (data/remote.py) are
fetched into `root/<entry>/` once per machine; the other processes of the node wait for that
fetch and read the local copy. Each entry is

- keyed: the caller's key (for a checkpoint: URL, step and manifest checksum) names it, and an
  entry whose recorded key or file table differs from what the caller expects is refetched;
- sealed: `.entry.json` (key, size and xxh3-128 checksum of every file) is written last and the
  folder renamed into place, so a killed fetch leaves only a temp folder, never an entry;
- verified: every hit is checked against its seal (and the caller's expected table) before it
  is handed out, sizes always and checksums when `verify="full"`;
- locked: `fcntl.flock` on a per-entry lock file; a fetch holds it exclusively, a reader shares
  it for as long as it uses the entry (`CacheEntry` is a context manager);
- bounded: after a fetch, least recently used entries are evicted until the cache holds at
  most `max_bytes`; entries in use (share-locked) and the new one are never evicted.

A cache entry is a copy of something that lives elsewhere, so evicting or replacing one loses
nothing. Locks are advisory and per machine (flock): put `root` on a local disk, not NFS.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import CorruptError
from trainguard.util.atomic import fsync_dir
from trainguard.util.hashing import file_checksum, stable_u64

SEAL = ".entry.json"
DEFAULT_MAX_BYTES = 64 << 30
FileTable = dict[str, dict[str, Any]]  # relative name -> {"size": int, "checksum": str}


def default_root() -> Path:
    base = os.environ.get("TRAINGUARD_CACHE") or os.path.join("~", ".cache", "trainguard")
    return Path(base).expanduser() / "node"


def table_of(folder: Path) -> FileTable:
    """Size and checksum of every regular file under `folder` (the seal excluded)."""
    out = {}
    for dirpath, _dirs, files in os.walk(folder):
        for f in files:
            path = Path(dirpath, f)
            rel = path.relative_to(folder).as_posix()
            if rel != SEAL:
                out[rel] = {"size": path.stat().st_size, "checksum": file_checksum(path)}
    return dict(sorted(out.items()))


@dataclass
class CacheEntry:
    """A verified entry, share-locked until `release()` (or the end of a `with` block)."""

    path: Path
    key: str
    files: FileTable
    hit: bool
    notes: list[str] = field(default_factory=list)  # why an existing copy was not used
    _fd: int | None = None

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:  # a forgotten entry must not block refetches forever
        self.release()

    def __enter__(self) -> CacheEntry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class NodeCache:
    """Entries under `root`, at most `max_bytes` in total after each fetch."""

    def __init__(self, root: Path | str | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("NodeCache max_bytes must be positive")
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.max_bytes = max_bytes
        (self.root / ".locks").mkdir(parents=True, exist_ok=True)

    def _name(self, key: str) -> str:
        return f"{stable_u64(key):016x}"

    def _lock(self, name: str) -> int:
        return os.open(self.root / ".locks" / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)

    def get(
        self,
        key: str,
        fill: Callable[[Path], None] | None,
        expect: FileTable | None = None,
        verify: str = "full",
    ) -> CacheEntry:
        """The entry for `key`, fetched by `fill(folder)` unless a valid copy exists.

        `expect` (the authoritative table, e.g. from a checkpoint manifest) must match the
        entry exactly; a fill that does not produce it raises CorruptError. With `fill=None`
        a missing entry raises KeyError (a reader that must not fetch). Do not call `get` for
        a key while holding that key's entry: the fetch would wait for your own lock."""
        name = self._name(key)
        fd = self._lock(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            why = self._check(name, key, expect, verify)
            if why is None:
                return self._hand_out(name, key, fd, hit=True, notes=[])
            fcntl.flock(fd, fcntl.LOCK_EX)  # converts the shared lock; waits for readers
            notes = [] if why == "absent" else [why]
            why = self._check(name, key, expect, verify)  # someone may have filled it meanwhile
            if why is None:
                fcntl.flock(fd, fcntl.LOCK_SH)
                return self._hand_out(name, key, fd, hit=True, notes=notes)
            if fill is None:
                raise KeyError(f"{key!r} is not in the node cache at {self.root} ({why})")
            files = self._fill(name, key, fill, expect)
            fcntl.flock(fd, fcntl.LOCK_SH)
            entry = self._hand_out(name, key, fd, hit=False, notes=notes, files=files)
        except BaseException:
            os.close(fd)
            raise
        self.evict(protect={name})
        return entry

    def adopt(self, key: str, folder: Path, files: FileTable | None = None) -> None:
        """Move `folder` (on the same file system) in as the entry for `key`: a copy just
        written here (a checkpoint's staged upload) need not be fetched back. `files` is its
        table if known (else the files are checksummed now)."""
        name = self._name(key)
        files = _strip(files) if files is not None else table_of(folder)
        seal = {"key": key, "files": files, "bytes": sum(f["size"] for f in files.values())}
        (folder / SEAL).write_text(json.dumps(seal))
        fd = self._lock(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._discard(self.root / name)
            os.rename(folder, self.root / name)
            fsync_dir(self.root)
        finally:
            os.close(fd)
        self.evict(protect={name})

    def _hand_out(
        self, name: str, key: str, fd: int, hit: bool, notes: list[str], files: Any = None
    ) -> CacheEntry:
        seal = self.root / name / SEAL
        if files is None:
            files = json.loads(seal.read_text())["files"]
        with contextlib.suppress(OSError):
            os.utime(seal)  # last use, for LRU eviction
        return CacheEntry(self.root / name, key, files, hit, notes, fd)

    def _check(self, name: str, key: str, expect: FileTable | None, verify: str) -> str | None:
        """None if the entry is valid, else why not ("absent" if there is none)."""
        folder = self.root / name
        try:
            seal = json.loads((folder / SEAL).read_text())
        except FileNotFoundError:
            return "absent"
        except (OSError, ValueError) as e:
            return f"unreadable seal: {e}"
        if seal.get("key") != key:
            return f"holds {seal.get('key')!r}, not {key!r}"
        files = seal.get("files", {})
        if expect is not None and _strip(files) != _strip(expect):
            return "its file table differs from the expected one (a newer version?)"
        for rel, entry in files.items():
            path = folder / rel
            try:
                size = path.stat().st_size
            except OSError:
                return f"{rel} is missing"
            if size != entry["size"]:
                return f"{rel} has {size} bytes, sealed with {entry['size']}"
            if verify == "full" and file_checksum(path) != entry["checksum"]:
                return f"{rel} does not match its sealed checksum"
        return None

    def _fill(
        self, name: str, key: str, fill: Callable[[Path], None], expect: FileTable | None
    ) -> FileTable:
        tmp = self.root / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            fill(tmp)
            files = table_of(tmp)
            if expect is not None and _strip(files) != _strip(expect):
                bad = sorted(
                    n for n in set(files) | set(expect) if files.get(n) != _strip_one(expect.get(n))
                )
                raise CorruptError(
                    f"fetched copy of {key} does not match what was expected: {bad}",
                    "fetch again; if it repeats, the source changed or is damaged",
                )
            seal = {"key": key, "files": files, "bytes": sum(f["size"] for f in files.values())}
            with open(tmp / SEAL, "w") as f:
                json.dump(seal, f)
                f.flush()
                os.fsync(f.fileno())
            self._discard(self.root / name)
            os.rename(tmp, self.root / name)
            fsync_dir(self.root)
            return files
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _discard(self, folder: Path) -> None:
        if folder.exists():
            trash = folder.with_name(f".trash-{folder.name}-{os.getpid()}-{time.monotonic_ns()}")
            os.rename(folder, trash)
            shutil.rmtree(trash, ignore_errors=True)

    def entries(self) -> list[tuple[str, int, float]]:
        """(name, bytes, last use) of every sealed entry."""
        out = []
        for folder in self.root.iterdir():
            seal = folder / SEAL
            if folder.name.startswith(".") or not seal.is_file():
                continue
            with contextlib.suppress(OSError, ValueError, KeyError):
                out.append(
                    (folder.name, int(json.loads(seal.read_text())["bytes"]), seal.stat().st_mtime)
                )
        return out

    def evict(self, protect: frozenset[str] | set[str] = frozenset()) -> list[str]:
        """Remove least recently used entries until at most `max_bytes` remain."""
        entries = sorted(self.entries(), key=lambda e: e[2])
        total = sum(e[1] for e in entries)
        evicted = []
        for name, nbytes, _used in entries:
            if total <= self.max_bytes:
                break
            if name in protect:
                continue
            fd = self._lock(name)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # in use: skip it
            except OSError:
                os.close(fd)
                continue
            try:
                self._discard(self.root / name)
                evicted.append(name)
                total -= nbytes
            except OSError:
                pass  # eviction is housekeeping: it never fails the fetch that triggered it
            finally:
                os.close(fd)
        return evicted


def _strip_one(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if entry is None else {"size": entry["size"], "checksum": entry["checksum"]}


def _strip(table: FileTable) -> FileTable:
    return {k: _strip_one(v) for k, v in table.items()}  # type: ignore[misc]
