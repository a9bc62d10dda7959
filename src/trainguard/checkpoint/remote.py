"""Checkpoints on object storage (any fsspec URL: s3://, gs://, memory://, ...).

Object stores have no rename, so the commit protocol differs from the local one: payload
objects are uploaded first and verified (size, and read-back checksum unless disabled), and
only then is `manifest.json` uploaded as the commit marker. A prefix without a manifest is a
killed upload and is never loaded. Every transfer is retried with full-jitter backoff, metered
by a token bucket and offset by `rank * stagger_s` (`transfers.py`). The payload is staged in a
local cache folder, which then becomes the cached copy of the latest checkpoint so a resume on
the same machine does not download it again. Manifest names are checked (`entry_problem`)
before any object is downloaded, and no read takes more bytes than the manifest lists. A step
that failed verification is copied to `quarantine/` (or `attic/<label>/`) and only then removed
(the listing, moving aside and deleting of steps: `remote_steps.py`).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from trainguard.checkpoint.folder import read_manifest, verify_local_folder
from trainguard.checkpoint.local import (
    clean_stale_temps,
    install,
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
from trainguard.checkpoint.remote_steps import RemoteSteps
from trainguard.checkpoint.retry import RetryPolicy, RetryStats, TokenBucket, VerifyMismatch
from trainguard.checkpoint.transfers import ObjectTransfers
from trainguard.errors import BadInputError
from trainguard.findings import Finding
from trainguard.util.node_cache import CacheEntry, NodeCache


class RemoteBackend(RemoteSteps):
    """Step prefixes `<root>/step-<N>/` on an fsspec filesystem (`RemoteSteps`: listing,
    moving aside, deleting), saved and loaded through a local cache."""

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
        url = url.rstrip("/")
        super().__init__(fs, root, url, ObjectTransfers(fs, url, policy, bucket, rank, sleep))
        self.node_cache = node_cache
        self._held: CacheEntry | None = None  # the node-cache entry last handed out
        self.cache_dir, self.policy = cache_dir, policy
        self.rank, self.on_phase = rank, on_phase
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BadInputError(
                f"cannot create checkpoint cache folder {cache_dir}: {e.strerror or e}",
                "pass cache_dir= a writable local folder",
            ) from e
        clean_stale_temps(cache_dir)

    # The transfers' retry counts, byte-rate bucket and sleep (a test's clock) are the backend's.
    @property
    def stats(self) -> RetryStats:
        return self.io.stats

    @stats.setter
    def stats(self, stats: RetryStats) -> None:
        self.io.stats = stats

    @property
    def bucket(self) -> TokenBucket | None:
        return self.io.bucket

    @bucket.setter
    def bucket(self, bucket: TokenBucket | None) -> None:
        self.io.bucket = bucket

    @property
    def sleep(self) -> Callable[[float], None]:
        return self.io.sleep

    @sleep.setter
    def sleep(self, sleep: Callable[[float], None]) -> None:
        self.io.sleep = sleep

    def new_stage(self, step: int) -> Path:
        """A local folder in the cache to stage the payload in before upload."""
        clean_stale_temps(self.cache_dir)
        return new_temp_dir(self.cache_dir, step)

    def commit(self, step: int, stage: Path, manifest: dict[str, Any]) -> tuple[str, list[Finding]]:
        self.stats = RetryStats()
        self.io.stagger()
        known = self._known if self._known is not None else self._listing()
        if step in known:
            self._remove_remote(step)  # a step saved again after a rollback
        for name, entry in sorted(manifest["files"].items()):
            self.io.upload(stage / name, self._rpath(step, name), entry)
        write_manifest(stage, manifest)
        if self.on_phase is not None:
            self.on_phase("checkpoint_rename", step)
        mbytes = (stage / MANIFEST).read_bytes()
        self._manifests[(step, len(mbytes))] = mbytes  # retention need not read it back
        self.io.upload(
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
            return self.io.retry(
                lambda: self.io.read_object(rpath, hint, limit=size)[1], f"read {rpath}"
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
        self.io.stagger()
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
                    return self.io.read_object(self._rpath(step, name), hint, dst, limit=hint)[1]

            got[name] = self.io.retry(once, f"download {name}")
        return check_files(manifest, sizes.get, lambda name, _size: got[name], self.location(step))

    # -- sharded saves: every rank uploads its own files ---------------------------------------
    def upload_files(self, step: int, folder: Path, files: dict[str, dict]) -> None:
        """Upload this process's payload files of `step` from `folder` ({name: {"size",
        "checksum"}} as the writer computed them): staggered by rank, rate-limited, retried,
        read back and verified; the retries are in `self.stats`. The step is not committed
        until `commit_manifest`."""
        self.stats = RetryStats()
        self.io.stagger()
        for name, entry in sorted(files.items()):
            self.io.upload(folder / name, self._rpath(step, name), entry)

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

        self.io.retry(put, f"upload {self.location(step)}/{MANIFEST}")
        why = self.io.retry(lambda: self.io.mismatch(self._rpath(step, MANIFEST), entry), "verify")
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
            self.io.stagger()
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
