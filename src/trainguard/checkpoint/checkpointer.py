"""`trainguard.Checkpointer`: verified, collective checkpoints of any training state.

    ckpt = trainguard.Checkpointer("s3://bucket/run", keep=3, async_save=True)
    state = {"model": model, "optimizer": opt, "sampler": sampler, "guard": guard}
    start = ckpt.load_latest(state) or 0       # every rank calls it; restores in place
    for step in range(start, max_steps):
        ...
        if (step + 1) % 100 == 0:
            ckpt.save(step + 1, state)          # every rank calls it; step = completed steps
    ckpt.close()

Non-sharded state goes through a Layout (layout.py) and rank 0's CheckpointStore (temp name,
fsync, manifest last, rename; fsspec URLs with staggered, rate-limited, retried uploads).
FSDP2-sharded state (or `sharded=True`) goes through DCP, every rank writing its own shards
(sharded.py). Either way every rank's RNG states are saved, loading verifies every file before
anything reads it, falls back past damaged steps (findings in `last_findings`, logged) and
retention keeps the newest `keep`. A remote checkpoint is fetched once per machine into the node
cache (node_cache.py) and read there by the machine's other ranks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.checkpoint.checkpointer_load import (
    FORMAT,
    CheckpointLoading,
    _dicts,
    _findings,
    log,
)
from trainguard.checkpoint.dcp_files import is_sharded_module
from trainguard.checkpoint.failures import failure_text
from trainguard.checkpoint.group import CheckpointGroup
from trainguard.checkpoint.layout import FlatLayout, Layout, Part, classify
from trainguard.checkpoint.results import AsyncSave
from trainguard.checkpoint.retry import RetryPolicy
from trainguard.checkpoint.rng import capture_rng
from trainguard.checkpoint.save_queue import SaveQueue, check_queue
from trainguard.checkpoint.store import CheckpointStore
from trainguard.errors import BadInputError, StorageError
from trainguard.findings import Finding
from trainguard.util.node_cache import NodeCache
from trainguard.util.paths import is_remote

if TYPE_CHECKING:
    from trainguard.checkpoint.sharded import ShardedIO

DCP_LAYOUT = "dcp/1"
Job = Callable[[], tuple[str, list[Finding]]]


class Checkpointer(CheckpointLoading):
    """Collective, verified checkpoints of a dict of modules, optimizers, stateful objects,
    tensors and plain data. See the module docstring; docs/architecture.md has the contract.

    Creating one is collective under torch.distributed (it makes a gloo group for its own
    traffic): every rank creates its Checkpointers in the same order. Extra keywords beyond
    issue 11's signature: `layout` (the files of a non-sharded checkpoint), `retry` (backoff,
    stagger and verification of remote transfers), `cache_dir` (the node cache, default
    `$TRAINGUARD_CACHE/node`), `on_phase(phase, step)` (fire drills: "shards_written" on every
    rank, "payload_written" on rank 0 once a non-sharded payload is written, "checkpoint_rename"
    on rank 0 just before the commit), `background_copy` (below).

    `background_copy=True` (with `async_save`, and a layout that has `stage`: FlatLayout, the
    default) moves the copy of the modules' and optimizers' tensors out of `save` too: it is
    the writer thread's first work, beside the caller's next forward and backward, and the
    caller calls `wait_copied()` before anything changes them (the optimizer step, a load).
    Layouts without `stage` copy inside `save`, as without it.

    `queue` (with `async_save`): how many snapshots may be held at once, the one being written
    included; a save waits for the oldest write only when that many are held, or with
    `when_full="skip"` returns a skipped handle (C124) instead. Memory: up to `queue` copies
    of the saved state. The default 1 waits for the previous write at every save
    (save_queue.py says more; sharded saves always wait for the previous one)."""

    def __init__(
        self,
        path_or_url: str | Path,
        *,
        keep: int = 3,
        async_save: bool = False,
        sharded: bool | None = None,
        rate_limit_mb_s: float | None = None,
        storage_options: dict | None = None,
        layout: Layout | None = None,
        retry: RetryPolicy | None = None,
        cache_dir: str | Path | None = None,
        on_phase: Callable[[str, int], None] | None = None,
        background_copy: bool = False,
        queue: int = 1,
        when_full: str = "wait",
    ) -> None:
        if rate_limit_mb_s is not None and rate_limit_mb_s <= 0:
            raise BadInputError(
                f"rate_limit_mb_s={rate_limit_mb_s} must be positive",
                "pass None for no limit, or megabytes per second per rank",
            )
        if background_copy and not async_save:
            raise BadInputError(
                "background_copy=True copies the state in the writer thread of an async save",
                "pass async_save=True with it, or leave background_copy out",
            )
        check_queue(queue, when_full, bool(async_save))
        if sharded not in (None, True, False):
            raise BadInputError(f"sharded={sharded!r}", "pass None (detect), True or False")
        self.root = str(path_or_url)
        self.async_save, self.sharded = bool(async_save), sharded
        self.background_copy = bool(background_copy)
        self.layout: Layout = layout or FlatLayout()
        self.group = CheckpointGroup()
        # With a queue the writer thread's outcome broadcast may overlap the next save's
        # collectives in the caller's thread: it gets a group of its own (collective to make,
        # like the first: every rank passes the same queue).
        self._writer_group = self.group
        if self.group.active and async_save and (queue > 1 or when_full != "wait"):
            self._writer_group = CheckpointGroup()
        node_cache, staging = None, None
        if is_remote(self.root):
            node_cache = NodeCache(cache_dir) if cache_dir is not None else NodeCache()
            # Uploads are staged beside the node cache, so a staged copy moves into it.
            staging = str(node_cache.root / ".staging")
        self.store = CheckpointStore(
            self.root,
            keep=keep,
            cache_dir=staging,
            rank=self.group.rank,
            world_size=self.group.size,
            storage_options=storage_options,
            retry=retry,
            rate_limit_bytes_per_s=rate_limit_mb_s * 1e6 if rate_limit_mb_s else None,
            on_phase=on_phase,
            node_cache=node_cache,
        )
        self.on_phase = on_phase
        self._sharded_io: ShardedIO | None = None  # made on the first sharded save or load
        self.last_findings: list[Finding] = []
        # The step `load_latest` restored: its local folder and its manifest's `meta`.
        self.last_path: Path | None = None
        self.last_meta: dict[str, Any] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._queue = SaveQueue(queue, when_full)
        self.queue_depth, self.when_full = queue, when_full
        self._copier: ThreadPoolExecutor | None = None  # background copies beside a write
        self._copied: threading.Event | None = None  # set once a background copy is made
        self.copy_wait_s = 0.0
        """Seconds `wait_copied` has blocked its caller, in all: the part of the checkpoint
        stall spent inside the next step (goodput accounting)."""
        self._housekeeping: list[Future[None]] = []  # background retention
        if self.async_save:
            # The writer thread starts now, not inside the first save: `Thread.start` waits
            # until the new thread has run, which on a busy machine is a wait for a free core.
            self._background().submit(lambda: None)
            if self.background_copy and queue > 1:
                self._copy_thread().submit(lambda: None)

    @property
    def sharded_io(self) -> ShardedIO:
        """The DCP save and load, imported on first use (dcp_files.py says why)."""
        if self._sharded_io is None:
            from trainguard.checkpoint.sharded import ShardedIO

            self._sharded_io = ShardedIO(self.store, self.group, self.on_phase)
        return self._sharded_io

    # -- saving --------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        state: dict[str, Any],
        meta: dict[str, Any] | None = None,
        *,
        may_skip: bool = True,
    ) -> str | AsyncSave:
        """Save `state` as step `step` (completed steps); collective. Returns the checkpoint's
        path or URL, or with `async_save=True` an AsyncSave handle (the state is captured
        before this returns, so the caller may change it right away; with `background_copy`,
        once `wait_copied()` has returned). `meta`: plain data for
        the manifest's `meta` (e.g. what the data was), read back as `last_meta`. With
        `when_full="skip"` a save that finds the queue full returns a handle with `skipped`
        (C124 in its `findings`) unless `may_skip=False` (it waits for room then)."""
        t0 = time.perf_counter()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise BadInputError(f"step={step!r}", "pass the number of completed steps, an int >= 0")
        parts = classify(state)
        sharded = self._is_sharded(parts)
        waited = 0.0
        if sharded:  # DCP's async staging is one buffer: one write at a time
            self._drain()
        elif self.async_save:
            self._queue.reap()
            if self._queue.when_full == "skip" and may_skip:
                full = [self._queue.full()]
                if self.group.active:  # every rank skips, or none does
                    full = self.group.all_gather(full[0])
                if any(full):
                    return self._queue.skipped(step, time.perf_counter() - t0)
            waited = self._queue.make_room()
        slot = self._queue.free_slot() if self.async_save else 0
        use_slot = getattr(self.layout, "use_slot", None)
        if use_slot is not None and not sharded:
            use_slot(slot)
        meta = {
            **(meta or {}),
            "checkpointer": {
                "format": FORMAT,
                "layout": DCP_LAYOUT if sharded else self.layout.name,
                "sharded": sharded,
                "world_size": self.group.size,
                "keys": {p.key: p.kind for p in parts},
            },
        }
        if sharded:  # the generator states travel with the shards' checksums to rank 0
            write = self.sharded_io.prepare_save(step, parts, capture_rng(), self.async_save, meta)

            def job() -> tuple[str, list[Finding]]:
                info = write()
                if self.group.rank == 0:  # retention in the background, as torchtitan purges
                    self._housekeeping.append(self._background().submit(self._prune, step))
                return info.location, info.findings
        else:  # rank 0 writes everything, every rank's generator states included
            job = self._plain_job(step, parts, self.group.all_gather(capture_rng()), meta)
        if not self.async_save:
            return self._finish(*job())
        found: list[Finding] = []  # the handle's findings, once written

        def run_job() -> str:
            location, findings = job()
            found.extend(findings)
            return self._finish(location, findings)

        try:
            future = self._background().submit(run_job)
        except BaseException:
            self._copied = None  # no job, no copy to wait for
            raise
        handle = AsyncSave(future, 0.0, step=step, findings=found)
        handle.stall_s, handle.waited_s, handle.slot = time.perf_counter() - t0, waited, slot
        self._queue.add(handle)
        return handle

    def _plain_job(self, step: int, parts: list[Part], rng: list[dict], meta: dict) -> Job:
        """Rank 0 captures the state now; the job writes it through the store and tells every
        rank the outcome."""
        snapshot, copy, error = None, None, None
        stage = getattr(self.layout, "stage", None) if self.background_copy else None
        if self.group.rank == 0:
            try:
                if stage is not None:
                    snapshot, copy = stage(parts, rng)
                else:
                    snapshot = self.layout.snapshot(parts, rng, self.async_save)
            except Exception as e:
                error = e
        self._agree(error, "capture the state for the checkpoint")
        copied = self._copied = threading.Event() if copy is not None else None
        copying: Future[None] | None = None
        if copy is not None and self._queue.depth > 1:
            # Its own thread: in the writer's, the copy would wait for the writes queued
            # before it, and the caller's optimizer step for the copy (`wait_copied`).
            copying = self._copy_thread().submit(_copy_then_set, copy, copied)

        def job() -> tuple[str, list[Finding]]:
            location, findings, err = None, [], None
            if self.group.rank == 0:
                try:
                    if copying is not None:
                        copying.result()  # the copy's error is this save's
                    elif copy is not None and copied is not None:
                        _copy_then_set(copy, copied)  # first: the caller waits for it
                    info = self.store.save(step, lambda d: self._write(d, snapshot, step), meta)
                    location, findings = info.location, info.findings
                except Exception as e:
                    err = e
            outcome = self._writer_group.broadcast((location, failure_text(err), _dicts(findings)))
            if err is not None:
                raise err
            if outcome[1] is not None:
                raise StorageError(
                    outcome[1], "see rank 0's error; the previous checkpoint is kept"
                )
            return outcome[0], _findings(outcome[2])

        return job

    def _write(self, folder: Path, snapshot: Any, step: int) -> None:
        """The layout's files into the temp folder; then "payload_written" (fire drills kill
        there: the payload is on disk, its checksums and manifest are not)."""
        self.layout.write(folder, snapshot)
        if self.on_phase is not None:
            self.on_phase("payload_written", step)

    def _background(self) -> ThreadPoolExecutor:
        """One thread for async saves and retention, in order."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="trainguard-checkpointer")
        return self._executor

    def _copy_thread(self) -> ThreadPoolExecutor:
        """One thread for background copies when writes are queued (`queue` > 1)."""
        if self._copier is None:
            self._copier = ThreadPoolExecutor(1, thread_name_prefix="trainguard-copier")
        return self._copier

    @property
    def queue_counts(self) -> dict[str, int]:
        """Async saves handed to the writer, of them queued behind another write, that waited
        for room in the queue; saves skipped (C124)."""
        return dict(self._queue.counts)

    def make_room(self) -> float:
        """Wait until an async save can be queued without waiting (for the oldest writes,
        counted in `queue_counts`); the seconds waited. A failed write's error is raised."""
        return self._queue.make_room()

    def pending_saves(self) -> int:
        """Async saves queued or being written now."""
        self._queue.reap()
        return len(self._queue.pending)

    def _prune(self, step: int) -> None:
        _deleted, findings = self.store.prune(protect=step)
        for f in findings:
            log.warning("%s", f)

    def _finish(self, location: str, findings: list[Finding]) -> str:
        self._report(findings)
        return location

    def _is_sharded(self, parts: list[Part]) -> bool:
        if self.sharded is not None:
            return self.sharded
        return any(p.kind == "module" and is_sharded_module(p.value) for p in parts)

    def wait_copied(self) -> None:
        """Return once the state of the save in flight is copied (`background_copy`): the
        caller may change it from then on. Returns at once when no copy is under way; an error
        of the copy is raised where the save's is (its `wait`, the next save, `close`)."""
        copied, self._copied = self._copied, None
        if copied is not None and not copied.is_set():
            t0 = time.perf_counter()
            copied.wait()
            self.copy_wait_s += time.perf_counter() - t0

    def _drain(self) -> None:
        """Wait for the async saves held; raise the first error nobody has seen."""
        self._queue.drain()

    def close(self) -> None:
        """Wait for an async save in flight (raising its error if never waited for)."""
        try:
            self._drain()
        finally:
            self._housekeeping = []
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._copier is not None:
                self._copier.shutdown(wait=True)
                self._copier = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy_then_set(copy: Callable[[], None], copied: threading.Event) -> None:
    try:
        copy()
    finally:
        copied.set()
