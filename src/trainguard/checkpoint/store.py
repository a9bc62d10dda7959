"""The CheckpointStore: durable, verified, retained checkpoints, local or on object storage.

The store knows nothing about models. The training loop passes `write(folder)`, which writes
the payload files; the store checksums them, writes the manifest last, commits atomically
(rename locally, manifest-last upload remotely), verifies, and applies retention. Loading
verifies every file's size and checksum and falls back to the previous valid step on damage
(`loading.py`); the words of a failed save are in `failures.py`.
Nothing that failed verification is ever deleted: retention moves it to `quarantine/`.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from trainguard.checkpoint.failures import io_errno, retention_skipped, save_failure
from trainguard.checkpoint.fsurl import default_cache_dir
from trainguard.checkpoint.loading import newest_valid, try_load
from trainguard.checkpoint.local import ATTIC, LocalBackend, staged_bytes
from trainguard.checkpoint.manifest import (
    MANIFEST,
    build_manifest,
    step_dirname,
)
from trainguard.checkpoint.remote import RemoteBackend
from trainguard.checkpoint.results import CheckpointInfo, LoadedCheckpoint, SaveHandle
from trainguard.checkpoint.retention import apply_retention, displace
from trainguard.checkpoint.retry import RetryPolicy, TokenBucket
from trainguard.errors import BadInputError, CorruptError, StorageError
from trainguard.findings import Finding
from trainguard.util.fsurl import open_filesystem
from trainguard.util.node_cache import NodeCache
from trainguard.util.paths import is_remote, local_path


class CheckpointStore:
    """Verified checkpoints under `root`: a path, `file://...`, or any fsspec URL.

    Only `rank` 0 writes; every rank may load. Remote transfers start `rank * retry.stagger_s`
    seconds late, are limited to `rate_limit_bytes_per_s`, and are retried with full-jitter
    backoff. `filesystem` (an fsspec filesystem) overrides the one built from the URL;
    `on_phase(phase, step)` is called at "checkpoint_rename", just before the commit point
    (fire drills kill the process there). `node_cache` (remote roots): fetched steps go into
    this machine-wide cache (one download per node, shared by its processes) instead of the
    store's own `cache_dir`.
    """

    def __init__(
        self,
        root: str,
        keep: int = 3,
        *,
        cache_dir: str | None = None,
        rank: int = 0,
        world_size: int = 1,
        storage_options: dict | None = None,
        retry: RetryPolicy | None = None,
        rate_limit_bytes_per_s: float | None = None,
        filesystem: Any | None = None,
        on_phase: Callable[[str, int], None] | None = None,
        node_cache: NodeCache | None = None,
    ) -> None:
        if keep < 1:
            raise BadInputError(f"keep={keep}: at least one checkpoint must be kept", "keep >= 1")
        if not 0 <= rank < max(world_size, 1):
            raise BadInputError(f"rank {rank} is outside world_size {world_size}", "0 <= rank")
        if rate_limit_bytes_per_s is not None and rate_limit_bytes_per_s <= 0:
            raise BadInputError(
                f"rate_limit_bytes_per_s={rate_limit_bytes_per_s} must be positive",
                "pass None for no limit",
            )
        self.root, self.keep, self.rank, self.world_size = str(root), keep, rank, world_size
        self.retry = retry or RetryPolicy()
        self.last_findings: list[Finding] = []
        # Steps that failed verification or loading in this process: never loaded again, and
        # quarantined (not deleted, not kept as "valid") by the next retention.
        self._rejected: dict[int, list[Finding]] = {}
        self._warned: set[str] = set()  # entries of the root already reported as not steps
        self._lock = threading.RLock()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[CheckpointInfo] | None = None
        self.backend: LocalBackend | RemoteBackend
        if filesystem is None and not is_remote(self.root):
            self.backend = LocalBackend(local_path(self.root), on_phase)
        else:
            if filesystem is not None:
                fs, path = filesystem, filesystem._strip_protocol(self.root).rstrip("/")
            else:
                fs, path = open_filesystem(self.root, storage_options)
            bucket = TokenBucket(rate_limit_bytes_per_s) if rate_limit_bytes_per_s else None
            cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir(self.root)
            self.backend = RemoteBackend(
                fs,
                path,
                self.root,
                cache,
                self.retry,
                bucket,
                rank,
                on_phase,
                node_cache=node_cache,
            )

    # -- writing -------------------------------------------------------------------------------
    @property
    def writes(self) -> bool:
        return self.rank == 0

    def save(
        self, step: int, write: Callable[[Path], None], meta: dict | None = None
    ) -> CheckpointInfo:
        """Write, checksum, commit and verify step `step`, then apply retention."""
        if not self.writes:
            return CheckpointInfo(step, self.backend.location(step), {}, written=False)
        t0 = time.perf_counter()
        self._wait_pending()
        with self._lock:
            return self._commit(step, self._stage(step, write), meta, t0)

    def save_async(
        self, step: int, write: Callable[[Path], None], meta: dict | None = None
    ) -> SaveHandle:
        """Run `write` now (the state is captured before the caller mutates it), then checksum,
        upload, verify and prune in a background thread. One save is in flight at a time: a
        second call first waits for the previous one (that wait counts in `stall_s`). Call it
        from one thread (the training loop)."""
        t0 = time.perf_counter()
        if not self.writes:
            done: Future[CheckpointInfo] = Future()
            done.set_result(CheckpointInfo(step, self.backend.location(step), {}, written=False))
            return SaveHandle(done, 0.0)
        # Not under self._lock: the previous commit holds it until it finishes.
        self._wait_pending()
        stage = self._stage(step, write)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="trainguard-ckpt")
        self._pending = self._executor.submit(self._commit, step, stage, meta, t0)
        return SaveHandle(self._pending, time.perf_counter() - t0)

    def commit_files(
        self,
        step: int,
        stage: Path | None,
        files: dict[str, dict],
        meta: dict | None = None,
        prune: bool = True,
    ) -> CheckpointInfo:
        """Commit a step whose payload several processes wrote and checksummed (a sharded save).

        `files` is the table the writers reported ({name: {"size", "checksum"}}); the manifest
        is built from it rather than by reading every rank's files again. Locally `stage` is
        the shared temp folder holding all of them (renamed into place as in `save`); on
        object storage each writer has uploaded and verified its own objects
        (`backend.upload_files`), `stage` is None and only the manifest is uploaded, last.
        `prune=False` leaves retention to a later `prune(step)` (off the caller's path)."""
        t0 = time.perf_counter()
        with self._lock:
            try:
                manifest = build_manifest(None, step, meta, files=files)
                if stage is None:  # make_room(step) ran before the writers uploaded
                    location, findings = self.backend.commit_manifest(step, manifest)
                else:
                    displaced = displace(self.backend, step, self._rejected)
                    location, findings = self.backend.commit(step, stage, manifest)
                    findings = displaced + findings
            except Exception as e:
                if stage is not None:
                    shutil.rmtree(stage, ignore_errors=True)
                self.backend.abort(step)
                raise self._failure(step, "commit", e) from e
            nbytes = sum(int(f["size"]) for f in files.values())
            return self._verify_and_prune(step, location, manifest, nbytes, findings, t0, prune)

    def make_room(self, step: int) -> list[Finding]:
        """Before several writers upload step `step` to object storage: an old step of that
        number is quarantined if it failed verification, else replaced (removed first, so old
        and new objects never mix)."""
        with self._lock:
            findings = displace(self.backend, step, self._rejected)
            if self.backend.has_step(step):
                self.backend.delete(step)
            return findings

    def prune(self, protect: int) -> tuple[list[int], list[Finding]]:
        """Apply retention now, never deleting step `protect` (the newest save)."""
        with self._lock:
            try:
                status = self.backend.quick_status()
            except Exception as e:
                return [], [self._retention_skipped(e)]
            return apply_retention(self.backend, status, self.keep, protect, self._rejected)

    def _wait_pending(self) -> None:
        if self._pending is not None:
            wait([self._pending])  # its outcome belongs to its own handle
            self._pending = None

    def close(self) -> None:
        """Wait for an in-flight async save and stop the background thread."""
        self._wait_pending()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _failure(self, step: int, action: str, exc: BaseException) -> StorageError:
        earlier = [s for s in self._safe_steps() if s != step]
        where, remote = self.backend.location(step), self.backend.remote
        return save_failure(step, action, exc, where, remote, earlier)

    def _safe_steps(self) -> list[int]:
        try:
            return self.steps()
        except Exception:
            return []

    def _stage(self, step: int, write: Callable[[Path], None]) -> Path:
        try:
            stage = self.backend.new_stage(step)
        except OSError as e:
            raise self._failure(step, "create a temporary folder for", e) from e
        try:
            write(stage)
            if (stage / MANIFEST).exists():
                raise BadInputError(
                    f"write() created {MANIFEST} in the checkpoint folder; the store reserves it",
                    f"name the file differently; the store writes {MANIFEST} itself",
                )
        except BaseException as e:
            shutil.rmtree(stage, ignore_errors=True)
            if isinstance(e, Exception) and io_errno(e) is not None:
                raise self._failure(step, "write", e) from e
            raise  # a bug in the caller's write(): not a storage problem
        return stage

    def _commit(self, step: int, stage: Path, meta: dict | None, t0: float) -> CheckpointInfo:
        with self._lock:
            try:
                nbytes = staged_bytes(stage)
                manifest = build_manifest(stage, step, meta)
                displaced = displace(self.backend, step, self._rejected)
                location, findings = self.backend.commit(step, stage, manifest)
                findings = displaced + findings
            except Exception as e:
                shutil.rmtree(stage, ignore_errors=True)
                if isinstance(e, BadInputError):
                    raise
                self.backend.abort(step)
                raise self._failure(step, "commit", e) from e
            return self._verify_and_prune(step, location, manifest, nbytes, findings, t0)

    def _verify_and_prune(
        self,
        step: int,
        location: str,
        manifest: dict[str, Any],
        nbytes: int,
        findings: list[Finding],
        t0: float,
        prune: bool = True,
    ) -> CheckpointInfo:
        with self._lock:
            # Verify the new step in place before pruning anything older.
            try:
                status = self.backend.quick_status()
            except Exception as e:  # committed, but unlisted: keep everything, say so
                findings.append(self._retention_skipped(e))
                status = {step: (True, True)}
            if not status.get(step, (False, False))[1]:
                problems = self.backend.verify(step, full=False)
                code = "C201" if self.backend.remote else "C106"
                raise StorageError(
                    f"{code}: checkpoint step {step} failed verification right after it was "
                    "written: " + "; ".join(f.message for f in problems),
                    "check the storage for silent truncation; older checkpoints were kept",
                )
            if prune:
                deleted, prune_findings = apply_retention(
                    self.backend, status, self.keep, step, self._rejected
                )
            else:
                deleted, prune_findings = [], []
            if self.backend.remote:  # retries of the listing and pruning above count too
                findings = [f for f in findings if f.code not in ("C202", "C203")]
                findings += self.backend.stats.findings(step, "save", location)
            return CheckpointInfo(
                step=step,
                location=location,
                manifest=manifest,
                bytes=nbytes,
                seconds=time.perf_counter() - t0,
                findings=findings + prune_findings,
                deleted=deleted,
            )

    # -- retention -----------------------------------------------------------------------------
    def _retention_skipped(self, exc: BaseException) -> Finding:
        return retention_skipped(self.root, self.backend.remote, exc)

    def delete(self, step: int) -> None:
        """Delete one step (for example checkpoints newer than a rollback target)."""
        with self._lock:
            self.backend.delete(step)

    # -- reading -------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Committed steps (step folders holding a manifest), ascending. Not yet verified."""
        return sorted(s for s, committed in self.backend.step_folders().items() if committed)

    def verify(self, step: int) -> list[Finding]:
        """Every finding for step `step`: manifest, then each file's size and checksum."""
        return self.backend.verify(step, full=True)

    def load(self, step: int) -> LoadedCheckpoint:
        """Step `step` as a verified local folder; CorruptError if anything does not match."""
        loaded, findings = try_load(self.backend, step)
        if loaded is None:
            self._rejected[step] = findings
            raise CorruptError(
                f"checkpoint step {step} at {self.backend.location(step)} is invalid: "
                + "; ".join(f.message for f in findings if f.severity == "error"),
                "load another step (load_latest falls back automatically) or restore the "
                "folder from a copy",
            )
        return loaded

    def load_latest(
        self, usable: Callable[[LoadedCheckpoint], list[Finding]] | None = None
    ) -> LoadedCheckpoint | None:
        """The newest valid checkpoint; damaged newer ones become findings on the result.

        `usable(loaded)` may check more than the checksums (that the files load into a model,
        say): error findings from it reject the step like a checksum mismatch. Entries of the
        root that are not checkpoints are warned about once each (C110); a local `step-<N>`
        folder without a manifest is reported (C104). None if no checkpoint is valid; then
        `last_findings` says why (C107, listing every step and its problems, when checkpoints
        exist but none can be used).
        """
        loaded, self.last_findings = newest_valid(
            self.backend, self.root, self._rejected, self._warned, usable
        )
        return loaded

    # -- setting aside -------------------------------------------------------------------------
    def set_aside(self, label: str) -> list[str]:
        """Move every step folder to `attic/<label>/` (for a run started over on purpose);
        returns the new locations. Nothing is deleted."""
        with self._lock:
            self._wait_pending()
            return [
                self.backend.move_aside(s, f"{ATTIC}/{label}/{step_dirname(s)}")
                for s in sorted(self.backend.step_folders())
            ]
