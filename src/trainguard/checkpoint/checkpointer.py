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

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.checkpoint.dcp_files import is_sharded_module
from trainguard.checkpoint.failures import failure_text
from trainguard.checkpoint.group import CheckpointGroup
from trainguard.checkpoint.layout import FlatLayout, Layout, Part, check_keys, classify
from trainguard.checkpoint.results import AsyncSave, LoadedCheckpoint
from trainguard.checkpoint.resume import (
    check_payload,
    name_rank,
    refuse_if_none_usable,
    restore_generators,
    same_manifest,
    unlisted,
)
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

log = logging.getLogger("trainguard.checkpoint")
FORMAT = 1
DCP_LAYOUT = "dcp/1"
Job = Callable[[], tuple[str, list[Finding]]]


class Checkpointer:
    """Collective, verified checkpoints of a dict of modules, optimizers, stateful objects,
    tensors and plain data. See the module docstring; docs/architecture.md has the contract.

    Creating one is collective under torch.distributed (it makes a gloo group for its own
    traffic): every rank creates its Checkpointers in the same order. Extra keywords beyond
    issue 11's signature: `layout` (the files of a non-sharded checkpoint), `retry` (backoff,
    stagger and verification of remote transfers), `cache_dir` (the node cache, default
    `$TRAINGUARD_CACHE/node`), `on_phase(phase, step)` (fire drills: "shards_written" on every
    rank, "checkpoint_rename" on rank 0 just before the commit), `background_copy` (below).

    `background_copy=True` (with `async_save`, and a layout that has `stage`: `trainguard
    run`'s) moves the copy of the weights and the optimizer state out of `save` too: it is the
    writer thread's first work, beside the caller's next forward and backward, and the caller
    calls `wait_copied()` before anything changes them (the optimizer step, a load). Other
    layouts copy inside `save`, as without it.

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
                    info = self.store.save(step, lambda d: self.layout.write(d, snapshot), meta)
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

    # -- loading -------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Committed steps in the root (not yet verified)."""
        return self.store.steps()

    def load_latest(self, state: dict[str, Any]) -> int | None:
        """Restore `state` in place from the newest valid checkpoint; collective.

        Returns its step (completed steps), or None when there is none (a fresh start). Rank 0
        picks the step (falling back past damaged ones) and every rank loads that one. When
        checkpoints exist but none can be used, every rank raises NoUsableCheckpoint (C107):
        starting over silently would lose the run; start over in another folder on purpose."""
        parts = classify(state)
        self._drain()
        wait(self._housekeeping)  # retention must not delete a step while it is read
        self._housekeeping = []
        choice, findings, error, mine = None, [], None, None
        if self.group.rank == 0:
            try:
                loaded = self.store.load_latest(usable=lambda c: self._usable(c, parts))
                findings = self.store.last_findings
                if loaded is not None:
                    choice = (loaded.step, loaded.manifest["manifest_checksum"], loaded.manifest)
                    mine = loaded.path
            except Exception as e:
                error = e
        choice, text, finding_dicts = self.group.broadcast(
            (choice, failure_text(error), _dicts(findings))
        )
        if error is not None:
            raise error
        if text is not None:
            raise StorageError(text, "see rank 0's error")
        findings = [name_rank(f) for f in _findings(finding_dicts)]
        if choice is None:
            self._report(findings)
            refuse_if_none_usable(findings, self.root)
            return None
        step, checksum, manifest = choice
        rng: list[dict] = []
        try:
            folder = self._folder(step, checksum, mine)
            try:
                rng = self._restore(folder, parts, state, step, manifest["meta"])
            except Exception as e:
                error = e
            self._agree(error, f"restore checkpoint step {step}")
        finally:
            if self.store.backend.remote:  # the node cache may evict or refetch it now
                self.store.backend.release_cache()
        findings += restore_generators(rng, step, self.group.rank, self.group.size)
        self._report(findings)
        self.last_path, self.last_meta = folder, dict(manifest.get("meta") or {})
        return step

    def _usable(self, loaded: LoadedCheckpoint, parts: list[Part]) -> list[Finding]:
        """Rank 0's checks of a verified step before it is chosen: the payload's format, the
        layout's files listed in the manifest, then the layout's own (a layout with
        `check(folder, parts, step) -> findings` reads its files against the caller's objects;
        an error finding passes the step over)."""
        found = check_payload(loaded)  # a sharded step: every file DCP would read is listed
        info = loaded.manifest.get("meta", {}).get("checkpointer") or {}
        if found or info.get("sharded"):
            return found
        # The layout's files must be listed: an unlisted one is never opened (a FIFO there
        # would block the load), so the step is passed over like a damaged one.
        # (A step of another layout is refused by `_restore` before anything is read.)
        unmarked = not info and getattr(self.layout, "reads_unmarked", False)
        mine = info.get("layout") == self.layout.name or unmarked
        found = unlisted(loaded, getattr(self.layout, "files", ())) if mine else []
        check = getattr(self.layout, "check", None)
        if found or check is None:
            return found
        return check(loaded.path, parts, loaded.step)

    def _folder(self, step: int, checksum: str, verified: Path | None) -> Path:
        """The verified local folder of `step` on this rank; collective. `verified` is rank 0's.

        Local roots are shared by every rank (rank 0 verified the files). Remote ones are
        fetched once per machine: each node's local rank 0 downloads and verifies into the
        node cache while the node's other ranks wait, then they verify the local copy."""
        g, folder, error = self.group, verified, None

        def fetch() -> None:
            nonlocal folder, error
            try:
                folder = folder or self.store.load(step).path
                same_manifest(folder, step, checksum, g.rank)
            except Exception as e:
                error = e

        if not self.store.backend.remote:
            folder = folder or Path(self.store.backend.location(step))
            fetch()
        else:
            if g.rank == 0 or g.is_node_leader:
                fetch()
            g.barrier()  # the node's copy is in place before its other ranks look
            if not (g.rank == 0 or g.is_node_leader):
                fetch()
        self._agree(error, f"fetch checkpoint step {step}")
        assert folder is not None
        return folder

    def _restore(
        self, folder: Path, parts: list[Part], state: dict, step: int, meta: dict
    ) -> list[dict]:
        info = meta.get("checkpointer")
        if info is None and getattr(self.layout, "reads_unmarked", False):
            return self.layout.read(folder, parts, state, step)  # the layout's older files
        if not isinstance(info, dict) or info.get("format") != FORMAT:
            raise BadInputError(
                f"checkpoint step {step} in {self.root} was not written by a Checkpointer "
                "(its manifest has no 'checkpointer' entry of this format)",
                "point the Checkpointer at its own folder; `trainguard run` checkpoints are "
                "read by `trainguard run`",
            )
        check_keys(info["keys"], parts, step)
        if info["sharded"]:
            return self.sharded_io.load(folder, parts, state, step)
        if info["layout"] != self.layout.name:
            raise BadInputError(
                f"checkpoint step {step} has layout {info['layout']!r}; this Checkpointer "
                f"reads {self.layout.name!r}",
                "load it with a Checkpointer given the layout it was written with",
            )
        return self.layout.read(folder, parts, state, step)

    # -- helpers -------------------------------------------------------------------------------
    def _agree(self, error: BaseException | None, what: str) -> None:
        """Raise on every rank if the step failed on any (the local error where it happened)."""
        failed = self.group.agree(error)
        if error is not None:
            raise error
        if failed:
            rank, text, bad_input = failed[0]
            cls = BadInputError if bad_input else StorageError
            raise cls(f"could not {what}: rank {rank} failed: {text}", "see that rank's error")

    def _report(self, findings: list[Finding]) -> None:
        self.last_findings = findings
        if self.group.rank != 0:
            return
        for f in findings:
            level = {"error": logging.ERROR, "warning": logging.WARNING}.get(
                f.severity, logging.INFO
            )
            log.log(level, "%s", f)


def _copy_then_set(copy: Callable[[], None], copied: threading.Event) -> None:
    try:
        copy()
    finally:
        copied.set()


def _dicts(findings: list[Finding]) -> list[dict]:
    return [f.to_dict() for f in findings]


def _findings(dicts: list[dict]) -> list[Finding]:
    return [Finding.from_dict(d) for d in dicts]
