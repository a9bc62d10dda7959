"""Checkpoints on object storage (any fsspec URL: s3://, gs://, memory://, ...).

Object stores have no rename, so the commit protocol differs from the local one: payload
objects are uploaded first and verified (size, and read-back checksum unless disabled), and
only then is `manifest.json` uploaded as the commit marker. A prefix without a manifest is a
killed upload and is never loaded. Every transfer is retried with full-jitter backoff, metered
by a token bucket and offset by `rank * stagger_s`. The payload is staged in a local cache
folder, which then becomes the cached copy of the latest checkpoint so a resume on the same
machine does not download it again. Manifest names are checked (`entry_problem`) before any
object is downloaded, and no read takes more bytes than the manifest lists. A step that failed
verification is copied to `quarantine/` (or `attic/<label>/`) and only then removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from trainguard.checkpoint.folder import MANIFEST_MAX_BYTES, read_manifest, verify_local_folder
from trainguard.checkpoint.local import (
    SET_ASIDE,
    clean_stale_temps,
    install,
    junk_reason,
    new_temp_dir,
    remove_step_folder,
    write_manifest,
)
from trainguard.checkpoint.manifest import (
    MANIFEST,
    UnsafeEntry,
    check_files,
    manifest_bytes,
    parse_manifest,
    parse_step_dirname,
    step_dirname,
)
from trainguard.checkpoint.retry import (
    RetryPolicy,
    RetryStats,
    TokenBucket,
    VerifyMismatch,
    retry_call,
)
from trainguard.errors import BadInputError
from trainguard.findings import Finding
from trainguard.util.hashing import CHUNK
from trainguard.util.node_cache import CacheEntry, NodeCache
from trainguard.util.paths import credentials_error

# Objects up to this size are read in one GET (manifests, loader state, small shards).
SMALL_OBJECT = 8 << 20


class RemoteBackend:
    """Step prefixes `<root>/step-<N>/` on an fsspec filesystem, with a local cache."""

    remote = True

    def __init__(
        self,
        fs: Any,
        root: str,
        url: str,
        cache_dir: Path,
        policy: RetryPolicy,
        bucket: TokenBucket | None,
        rank: int = 0,
        on_phase: Callable[[str, int], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        node_cache: NodeCache | None = None,
    ) -> None:
        self.fs, self.root, self.url = fs, root, url.rstrip("/")
        self.node_cache = node_cache
        self._held: CacheEntry | None = None  # the node-cache entry last handed out
        self.cache_dir, self.policy, self.bucket = cache_dir, policy, bucket
        self.rank, self.on_phase, self.sleep = rank, on_phase, sleep
        self.stats = RetryStats()
        self.ignored: list[tuple[str, str]] = []  # top-level names of the last listing, not steps
        self._known: dict[int, dict[str, int]] | None = None  # the last listing
        self._manifests: dict[tuple[int, int], bytes | None] = {}
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BadInputError(
                f"cannot create checkpoint cache folder {cache_dir}: {e.strerror or e}",
                "pass cache_dir= a writable local folder",
            ) from e
        clean_stale_temps(cache_dir)

    # -- paths and listing ---------------------------------------------------------------------
    def _rpath(self, step: int, name: str = "") -> str:
        base = f"{self.root}/{step_dirname(step)}"
        return f"{base}/{name}" if name else base

    def location(self, step: int) -> str:
        return f"{self.url}/{step_dirname(step)}"

    def _retry(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return retry_call(fn, self.policy, what, self.stats, self.sleep)
        except Exception as e:
            err = credentials_error(e, self.url)  # bad input (exit 2), not a storage fault
            if err is None:
                raise
            raise err from None

    def _listing(self) -> dict[int, dict[str, int]]:
        """{step: {relative name: size}} for every object under the root, in one listing."""

        def find() -> dict[str, Any]:
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache(self.root)
            try:
                return self.fs.find(self.root, detail=True)
            except FileNotFoundError:
                return {}

        out: dict[int, dict[str, int]] = {}
        ignored: dict[str, str] = {}
        prefix = self.fs._strip_protocol(self.root).rstrip("/") + "/"
        for name, info in self._retry(find, f"list {self.url}").items():
            rel = self.fs._strip_protocol(name)
            if not rel.startswith(prefix) or info.get("type") == "directory":
                continue
            head, _, rest = rel[len(prefix) :].partition("/")
            step = parse_step_dirname(head)
            if step is not None and rest:
                out.setdefault(step, {})[rest] = int(info.get("size") or 0)
            elif head not in SET_ASIDE:
                ignored[head] = junk_reason(head)
        self._known = out
        self.ignored = sorted(ignored.items())
        return out

    def step_folders(self) -> dict[int, bool]:
        return {s: MANIFEST in files for s, files in self._listing().items()}

    def has_step(self, step: int) -> bool:
        return step in (self._known if self._known is not None else self._listing())

    def move_aside(self, step: int, dest: str) -> str:
        """Copy step `step` to `<root>/<dest>/` (or `<dest>.1`, ...), manifest last, then
        remove it, manifest first: at every moment one of the two copies is whole."""
        names = sorted(self._listing().get(step, {}), key=lambda n: (n == MANIFEST, n))

        def taken(rel: str) -> bool:
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache(f"{self.root}/{rel}")
            try:
                return bool(self.fs.find(f"{self.root}/{rel}"))
            except FileNotFoundError:
                return False

        rel, n = dest, 0
        while self._retry(lambda r=rel: taken(r), f"list {self.url}/{dest}"):
            n += 1
            rel = f"{dest}.{n}"
        for name in names:
            src, dst = self._rpath(step, name), f"{self.root}/{rel}/{name}"
            self._retry(lambda s=src, d=dst: self.fs.copy(s, d), f"copy {src}")
        self._remove_remote(step, names)
        self._known = None
        return f"{self.url}/{rel}"

    def quick_status(self) -> dict[int, tuple[bool, bool]]:
        """{step: (committed, structurally valid)} from one listing plus each manifest."""
        out = {}
        for step, sizes in self._listing().items():
            if MANIFEST not in sizes:
                out[step] = (False, False)
                continue
            # Committed manifests are immutable; re-read one only if its size changed (an
            # edit). Loading always re-reads and verifies: this cache serves retention only.
            key = (step, sizes[MANIFEST])
            if key not in self._manifests:
                self._manifests[key] = self._read_manifest(step)
            manifest, _ = parse_manifest(self._manifests[key], step, self.location(step))
            ok = manifest is not None and not check_files(manifest, sizes.get, None, "")
            out[step] = (True, ok)
        return out

    def _read_manifest(self, step: int) -> bytes | None:
        def cat() -> bytes | None:
            try:
                path, cap = self._rpath(step, MANIFEST), MANIFEST_MAX_BYTES
                raw = self.fs.cat_file(path, start=0, end=cap)
                return raw if len(raw) < cap else b"\xff"  # too large to be one: C104
            except FileNotFoundError:
                return None

        return self._retry(cat, f"read {self.location(step)}/{MANIFEST}")

    # -- transfers -----------------------------------------------------------------------------
    def _throttle(self, n: int) -> None:
        if self.bucket is not None:
            self.bucket.acquire(n)

    def _stagger(self) -> None:
        if self.rank > 0 and self.policy.stagger_s > 0:
            self.sleep(self.rank * self.policy.stagger_s)

    def _read_object(
        self, rpath: str, size_hint: int, sink: Any = None, limit: int | None = None
    ) -> tuple[int, str]:
        """(size, xxh3 checksum) of an object, streamed into `sink` (a binary file) if given;
        with `limit`, of its first `limit` bytes only (a manifest entry's size: never more).

        Small objects take one GET; large ones are streamed in 1 MiB reads.
        """
        h, n = xxhash.xxh3_128(), 0

        def take(chunk: bytes) -> None:
            nonlocal n
            self._throttle(len(chunk))
            h.update(chunk)
            n += len(chunk)
            if sink is not None:
                sink.write(chunk)

        if limit == 0:
            pass  # nothing to read (and a zero-length range is not a valid request)
        elif size_hint <= SMALL_OBJECT:
            take(self.fs.cat_file(rpath, start=0, end=limit))
        else:
            with self.fs.open(rpath, "rb") as f:
                while chunk := f.read(CHUNK if limit is None else min(CHUNK, limit - n)):
                    take(chunk)
        return n, h.hexdigest()

    def _mismatch(self, rpath: str, entry: dict[str, Any]) -> str | None:
        """Why the object at `rpath` differs from `entry`, or None if it matches."""
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(rpath)
        if self.policy.verify_checksums:
            size, actual = self._read_object(rpath, entry["size"])
        else:
            size, actual = int(self.fs.info(rpath)["size"]), entry["checksum"]
        if size != entry["size"]:
            return f"{rpath}: uploaded {size} bytes, expected {entry['size']}"
        if actual != entry["checksum"]:
            return f"{rpath}: read-back checksum {actual}, expected {entry['checksum']}"
        return None

    def _upload(self, local: Path, rpath: str, entry: dict[str, Any]) -> None:
        """Upload, then verify before anything relies on the object (the manifest, pruning).

        Each request is retried on its own; a verified mismatch re-uploads the whole object.
        """

        def put() -> None:
            with open(local, "rb") as src, self.fs.open(rpath, "wb") as dst:
                while chunk := src.read(CHUNK):
                    self._throttle(len(chunk))
                    dst.write(chunk)

        for attempt in range(self.policy.attempts):
            self._retry(put, f"upload {rpath}")
            why = self._retry(lambda: self._mismatch(rpath, entry), f"verify {rpath}")
            if why is None:
                return
            if attempt == self.policy.attempts - 1:
                raise VerifyMismatch(f"{why} (after {self.policy.attempts} uploads)")
            self.stats.record(f"verify {rpath}", VerifyMismatch(why))
            self.sleep(self.policy.backoff(attempt))

    def _remove_remote(self, step: int, names: list[str] | None = None) -> None:
        """Delete a step; the manifest goes first, so a half-deleted step is never committed."""
        if names is None:
            names = list(self._listing().get(step, {}))

        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self._rpath(step, MANIFEST))
            rest = [self._rpath(step, n) for n in names if n != MANIFEST]
            if rest:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(rest)

        self._retry(rm, f"delete {self.location(step)}")

    def abort(self, step: int) -> None:
        """Best effort, one try: remove what a failed save uploaded (retention catches the rest)."""
        with contextlib.suppress(Exception):
            self._remove_remote(step, list(self._listing().get(step, {})))
        self._known = None

    def new_stage(self, step: int) -> Path:
        """A local folder in the cache to stage the payload in before upload."""
        clean_stale_temps(self.cache_dir)
        return new_temp_dir(self.cache_dir, step)

    def commit(self, step: int, stage: Path, manifest: dict[str, Any]) -> tuple[str, list[Finding]]:
        self.stats = RetryStats()
        self._stagger()
        known = self._known if self._known is not None else self._listing()
        if step in known:
            self._remove_remote(step)  # a step saved again after a rollback
        for name, entry in sorted(manifest["files"].items()):
            self._upload(stage / name, self._rpath(step, name), entry)
        write_manifest(stage, manifest)
        if self.on_phase is not None:
            self.on_phase("checkpoint_rename", step)
        mbytes = (stage / MANIFEST).read_bytes()
        self._manifests[(step, len(mbytes))] = mbytes  # retention need not read it back
        self._upload(
            stage / MANIFEST,
            self._rpath(step, MANIFEST),
            {"size": len(mbytes), "checksum": xxhash.xxh3_128(mbytes).hexdigest()},
        )
        # The staged folder becomes the cached copy of the newest checkpoint. The step is
        # already committed remotely, so a cache failure only costs a download on resume.
        try:
            if self.node_cache is not None:
                files = dict(manifest["files"])
                files[MANIFEST] = {
                    "size": len(mbytes),
                    "checksum": xxhash.xxh3_128(mbytes).hexdigest(),
                }
                self.node_cache.adopt(self._cache_key(step, manifest), stage, files)
            else:
                install(stage, self.cache_dir / step_dirname(step))
                self._prune_cache(keep=step)
        except OSError:
            shutil.rmtree(stage, ignore_errors=True)
        return self.location(step), self.stats.findings(step, "save", self.location(step))

    def _prune_cache(self, keep: int) -> None:
        for entry in self.cache_dir.iterdir():
            step = parse_step_dirname(entry.name)
            if step is not None and step != keep:
                remove_step_folder(entry)

    # -- verification and loading --------------------------------------------------------------
    def verify(self, step: int, full: bool = True) -> list[Finding]:
        manifest, findings = parse_manifest(self._read_manifest(step), step, self.location(step))
        if manifest is None:
            return findings
        sizes = self._listing().get(step, {})

        def checksum_of(name: str, size: int) -> str:
            rpath, hint = self._rpath(step, name), sizes[name]
            return self._retry(
                lambda: self._read_object(rpath, hint, limit=size)[1], f"read {rpath}"
            )

        return check_files(manifest, sizes.get, checksum_of if full else None, self.location(step))

    def fetch(self, step: int) -> tuple[Path, list[Finding], bool]:
        """(local verified folder, findings, from_cache); findings with errors mean corrupt."""
        self.stats = RetryStats()
        raw = self._read_manifest(step)
        manifest, findings = parse_manifest(raw, step, self.location(step))
        if manifest is None:
            return self.cache_dir / step_dirname(step), findings, False
        if self.node_cache is not None:
            assert raw is not None
            return self._fetch_into_node_cache(step, raw, manifest)
        cached = self.cache_dir / step_dirname(step)
        notes: list[Finding] = []
        if cached.is_dir():
            try:
                same = read_manifest(cached) == raw
            except UnsafeEntry:
                same = False
            problems = verify_local_folder(cached, step) if same else []
            if same and not problems:
                return cached, [], True
            why = "; ".join(f.message for f in problems) or "its manifest differs from the remote"
            notes.append(
                Finding.of(
                    "C205",
                    f"cached copy of step {step} not used ({why}); downloading it again",
                    step=step,
                    where=str(cached),
                )
            )
        self._stagger()
        stage = new_temp_dir(self.cache_dir, step)
        try:
            corrupt = self._download(step, manifest, stage)
            if corrupt:
                shutil.rmtree(stage, ignore_errors=True)
                return cached, notes + corrupt, False
            write_manifest(stage, manifest)
            install(stage, cached)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        self._prune_cache(keep=step)
        return cached, notes + self.stats.findings(step, "load", self.location(step)), False

    def _download(self, step: int, manifest: dict[str, Any], stage: Path) -> list[Finding]:
        """Download and checksum in one pass; findings for missing, short or corrupt objects."""
        sizes = self._listing().get(step, {})  # fresh: the step may have changed since
        got: dict[str, str] = {}
        for name, entry in sorted(manifest["files"].items()):
            if sizes.get(name) != entry["size"]:
                continue  # check_files reports it; do not download a known-bad object
            dest = stage / name
            dest.parent.mkdir(parents=True, exist_ok=True)

            def once(name: str = name, dest: Path = dest, hint: int = entry["size"]) -> str:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                with os.fdopen(os.open(dest, flags, 0o666), "wb") as dst:
                    return self._read_object(self._rpath(step, name), hint, dst, limit=hint)[1]

            got[name] = self._retry(once, f"download {name}")
        return check_files(manifest, sizes.get, lambda name, _size: got[name], self.location(step))

    def delete(self, step: int) -> list[Finding]:
        self._remove_remote(step, list((self._known or {}).get(step, {})) or None)
        if self._known is not None:
            self._known.pop(step, None)
        return []

    # -- sharded saves: every rank uploads its own files ---------------------------------------
    def upload_files(self, step: int, folder: Path, files: dict[str, dict]) -> None:
        """Upload this process's payload files of `step` from `folder` ({name: {"size",
        "checksum"}} as the writer computed them): staggered by rank, rate-limited, retried,
        read back and verified; the retries are in `self.stats`. The step is not committed
        until `commit_manifest`."""
        self.stats = RetryStats()
        self._stagger()
        for name, entry in sorted(files.items()):
            self._upload(folder / name, self._rpath(step, name), entry)

    def commit_manifest(self, step: int, manifest: dict[str, Any]) -> tuple[str, list[Finding]]:
        """Upload the manifest of a step whose payload its writers uploaded: the commit point."""
        self.stats = RetryStats()
        mbytes = manifest_bytes(manifest)
        if self.on_phase is not None:
            self.on_phase("checkpoint_rename", step)
        self._manifests[(step, len(mbytes))] = mbytes
        entry = {"size": len(mbytes), "checksum": xxhash.xxh3_128(mbytes).hexdigest()}

        def put() -> None:
            with self.fs.open(self._rpath(step, MANIFEST), "wb") as dst:
                dst.write(mbytes)

        self._retry(put, f"upload {self.location(step)}/{MANIFEST}")
        why = self._retry(lambda: self._mismatch(self._rpath(step, MANIFEST), entry), "verify")
        if why is not None:
            raise VerifyMismatch(why)
        self._known = None
        return self.location(step), self.stats.findings(step, "save", self.location(step))

    # -- loading through the machine-wide node cache -------------------------------------------
    def _cache_key(self, step: int, manifest: dict[str, Any]) -> str:
        return f"{self.url}/{step_dirname(step)}#{manifest['manifest_checksum']}"

    def release_cache(self) -> None:
        """Done reading the fetched step: the node cache may evict or refetch it again."""
        if self._held is not None:
            self._held.release()
            self._held = None

    def _fetch_into_node_cache(
        self, step: int, raw: bytes, manifest: dict[str, Any]
    ) -> tuple[Path, list[Finding], bool]:
        """Fetch `step` into the node cache (one download per machine: whichever process gets
        there first downloads, the others wait on the entry's lock and verify the copy)."""
        assert self.node_cache is not None
        key = self._cache_key(step, manifest)
        expect = dict(manifest["files"])
        expect[MANIFEST] = {"size": len(raw), "checksum": xxhash.xxh3_128(raw).hexdigest()}
        corrupt: list[Finding] = []

        class _Corrupt(Exception):
            pass

        def fill(dest: Path) -> None:
            self._stagger()
            corrupt.extend(self._download(step, manifest, dest))
            if corrupt:
                raise _Corrupt
            (dest / MANIFEST).write_bytes(raw)

        self.release_cache()
        try:
            entry = self.node_cache.get(key, fill, expect)
        except _Corrupt:
            return self.node_cache.root / "absent", corrupt, False
        self._held = entry  # kept from eviction until release_cache()
        notes = [
            Finding.of(
                "C205",
                f"cached copy of step {step} not used ({why}); downloading it again",
                step=step,
                where=str(entry.path),
            )
            for why in entry.notes
        ]
        return entry.path, notes + self.stats.findings(step, "load", self.location(step)), entry.hit
