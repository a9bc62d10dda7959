"""Sharded checkpoints: every rank writes its own shards through torch.distributed.checkpoint
(DCP), rank 0 commits them with a manifest once every rank has finished.

The protocol of one save (all ranks, on the Checkpointer's gloo group):
1. a staging folder: locally one shared temp folder in the checkpoint root (rank 0 makes it and
   broadcasts its path; the root must be a file system every rank sees); on object storage
   each rank stages its own files in a local temp folder;
2. `dcp.save` of the modules and optimizers (module-optimizer pairs as Stateful wrappers, as
   torchtitan does); rank 0 also writes the other values and every rank's RNG states;
3. every rank checksums its own files (and on object storage uploads them: staggered by rank,
   rate-limited, retried, read back and verified);
4. the tables are gathered to rank 0, which writes the manifest (the commit marker) only when
   every rank reported success: locally into the temp folder, renamed to `step-<N>` in one
   rename; remotely uploaded last. A rank that fails or dies leaves no manifest, so the step is
   never loaded; every surviving rank raises.

Loading reads only a folder whose every file the manifest has verified (checkpointer.py), its
`.metadata` through the restricted unpickler, non-tensor leaves with weights_only=True
(dcp_safe.py). DCP reshards on load, so N ranks' checkpoint loads on M ranks.
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
from torch.distributed.checkpoint.staging import BlockingAsyncStager

from trainguard.checkpoint.dcp_files import shard_rank
from trainguard.checkpoint.dcp_safe import (
    HashingFileSystemWriter,
    ModelState,
    OptimizerState,
    SafeFileSystemReader,
    WeightsOnlyLoadPlanner,
)
from trainguard.checkpoint.failures import failure_text
from trainguard.checkpoint.group import CheckpointGroup, RankLostError
from trainguard.checkpoint.layout import FlatLayout, Part
from trainguard.checkpoint.results import CheckpointInfo
from trainguard.checkpoint.staging import one_thread
from trainguard.checkpoint.store import CheckpointStore
from trainguard.errors import BadInputError, StorageError
from trainguard.findings import Finding
from trainguard.util.hashing import file_checksum

DCP_KINDS = ("module", "optimizer")
Phase = Callable[[str, int], None]


def dcp_state(parts: list[Part]) -> dict[str, Any]:
    """{key: Stateful} for the modules and optimizers; each optimizer paired with the module
    whose parameters it holds."""
    modules = [p for p in parts if p.kind == "module"]
    out: dict[str, Any] = {p.key: ModelState(p.value) for p in modules}
    for p in parts:
        if p.kind != "optimizer":
            continue
        held = {id(t) for g in p.value.param_groups for t in g["params"]}
        owner = next((m for m in modules if held <= {id(t) for t in m.value.parameters()}), None)
        if owner is None:
            raise BadInputError(
                f"optimizer state[{p.key!r}] holds parameters of no single module in the state; "
                "a sharded checkpoint stores optimizer state by parameter name, which needs "
                "the module",
                "put the module this optimizer trains into the same state dict",
            )
        out[p.key] = OptimizerState(owner.value, p.value)
    return out


def own_files(stage: Path, rank: int) -> list[str]:
    """The files in a staging folder this rank wrote: its DCP shards, and for rank 0 the DCP
    metadata and the non-DCP values."""
    names = []
    for path in stage.iterdir():
        if not path.is_file():
            continue
        r = shard_rank(path.name)
        if r == rank or (r is None and rank == 0):
            names.append(path.name)
    return sorted(names)


class ShardedIO:
    """The DCP save and load of one Checkpointer."""

    def __init__(
        self, store: CheckpointStore, group: CheckpointGroup, on_phase: Phase | None
    ) -> None:
        self.store, self.group, self.on_phase = store, group, on_phase
        self.rest_layout = FlatLayout()  # the values DCP does not hold, written by rank 0
        self._staged: dict[str, Any] | None = None  # CPU buffers of async saves
        self._displaced: list[Finding] = []  # a bad old copy of the step, quarantined

    def prepare_save(
        self, step: int, parts: list[Part], rng: dict, copy: bool, meta: dict
    ) -> Callable[[], CheckpointInfo]:
        """Capture the state and this rank's generators `rng` now (copied if `copy`); return
        the job that writes and commits."""
        wrappers = dcp_state(parts)
        rest = [p for p in parts if p.kind not in DCP_KINDS]
        state: dict[str, Any] = wrappers
        if copy:  # a CPU copy of every shard: training may go on while it is written
            with one_thread():  # staging.py says why
                state = self._stage({k: w.state_dict() for k, w in wrappers.items()})
        snapshot = self.rest_layout.snapshot(rest, [], copy) if self.group.rank == 0 else None
        return lambda: self._save(step, state, (snapshot, rng), meta)

    def _stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """Copy `state` into CPU buffers kept from the previous async save (pinned when CUDA is
        there), as torchtitan's async checkpointing does: after the first save the stall is
        one copy, not an allocation and a copy. The previous save has finished with the
        buffers: `Checkpointer.save` waits for it first."""
        try:
            from torch.distributed._state_dict_utils import (
                _copy_state_dict,
                _create_cpu_state_dict,
            )
        except ImportError:  # a torch without them: allocate every time
            return BlockingAsyncStager().stage(state)
        if self._staged is not None:
            try:
                return _copy_state_dict(state, self._staged)
            except (KeyError, RuntimeError, ValueError, AssertionError):
                self._staged = None  # the state changed shape (new optimizer state): rebuild
        self._staged = _create_cpu_state_dict(state, pin_memory=torch.cuda.is_available())
        return _copy_state_dict(state, self._staged)

    def _save(self, step: int, state: dict, snapshot: Any, meta: dict) -> CheckpointInfo:
        g, store = self.group, self.store
        stage: Path | None = None
        failed: list[tuple[int, str]] = [(g.rank, "interrupted")]  # until every rank reports
        rest, rng = snapshot
        self._displaced = []
        try:
            table, findings, error = {}, [], None
            try:
                stage = self._new_stage(step)
                table, findings = self._write_own(step, stage, state)
            except RankLostError:
                raise
            except (Exception, CheckpointException) as e:  # told to every rank below
                error = e
            # One gather: every rank's files, failure and retries, and its generator states.
            reports = g.all_gather((table, failure_text(error), _dicts(findings), rng))
            failed = [(r, rep[1]) for r, rep in enumerate(reports) if rep[1] is not None]
            info = None
            if g.rank == 0 and not failed:
                files = {name: entry for rep in reports for name, entry in rep[0].items()}
                notes = [Finding.from_dict(f) for rep in reports for f in rep[2]]
                remote = store.backend.remote
                try:
                    assert stage is not None
                    more, retries = self._write_rest(step, stage, rest, [rep[3] for rep in reports])
                    files.update(more)
                    # Retention runs afterwards, off the ranks' path (Checkpointer.save).
                    info = store.commit_files(
                        step, None if remote else stage, files, meta, prune=False
                    )
                    info.findings = self._displaced + notes + retries + info.findings
                except Exception as e:
                    failed = [(0, failure_text(e) or "")]
            failed, location = g.broadcast((failed, info.location if info else None))
        finally:
            self._discard_stage(stage, failed=bool(failed))
        if failed:
            texts = sorted({t for _r, t in failed})
            raise StorageError(
                f"C106: sharded checkpoint step {step} was not saved ("
                + "; ".join(texts)
                + "); no manifest was written, so the step is never loaded and the previous "
                "checkpoint is untouched",
                "fix the failing rank's storage (disk space, permissions, the store) and save "
                "again",
            )
        return info or CheckpointInfo(step, location, {}, written=False)

    def _write_own(
        self, step: int, stage: Path, state: dict
    ) -> tuple[dict[str, dict], list[Finding]]:
        """This rank's part of a save: its DCP shards (rank 0: and DCP's metadata),
        checksummed as DCP writes them, and on object storage uploaded."""
        writer = HashingFileSystemWriter(str(stage))
        g = self.group
        with _single_process_quiet(not g.active):
            dcp.save(state, storage_writer=writer, process_group=g.pg, no_dist=not g.active)
        if self.on_phase is not None:
            self.on_phase("shards_written", step)
        return self._publish(step, stage, own_files(stage, g.rank), writer.checksums)

    def _write_rest(
        self, step: int, stage: Path, rest: Any, rng: list[dict]
    ) -> tuple[dict[str, dict], list[Finding]]:
        """Rank 0, once every rank has written its shards: the values DCP does not hold and
        every rank's generator states (gathered with the shards' checksums), in state.*."""
        done = set(own_files(stage, 0))
        self.rest_layout.write(stage, self.rest_layout.add_rng(rest, rng))
        return self._publish(step, stage, [n for n in own_files(stage, 0) if n not in done], {})

    def _publish(
        self, step: int, stage: Path, names: list[str], known: dict[str, dict]
    ) -> tuple[dict[str, dict], list[Finding]]:
        """Manifest entries of files this rank wrote (checksummed now unless `known`); on
        object storage they are uploaded (staggered, rate-limited, retried, verified)."""
        table = {}
        for name in names:
            path = stage / name
            table[name] = known.get(name) or {
                "size": path.stat().st_size,
                "checksum": file_checksum(path),
            }
        backend = self.store.backend
        if not backend.remote:
            return table, []
        backend.upload_files(step, stage, table)
        rank = self.group.rank
        retries = backend.stats.findings(step, f"rank {rank}'s upload", backend.location(step))
        for f in retries:
            f.rank = rank
        return table, retries

    def _discard_stage(self, stage: Path | None, failed: bool) -> None:
        """Remote: each rank's local copy is spent once uploaded. Local: rank 0 removes the
        shared temp folder of a failed save (a committed one was renamed away)."""
        if stage is None:
            return
        if self.store.backend.remote or (failed and self.group.rank == 0):
            shutil.rmtree(stage, ignore_errors=True)

    def _new_stage(self, step: int) -> Path:
        """Locally, rank 0's temp folder in the shared root; remotely, one per process."""
        if self.store.backend.remote:
            if self.group.rank == 0:
                self._displaced = self.store.make_room(step)
            self.group.barrier()
            return self.store.backend.new_stage(step)
        path = str(self.store.backend.new_stage(step)) if self.group.rank == 0 else None
        return Path(self.group.broadcast(path))

    def load(self, folder: Path, parts: list[Part], state: dict[str, Any], step: int) -> list[dict]:
        """Restore `state` in place from a verified sharded checkpoint folder; the generator
        states of every saved rank."""
        g = self.group
        try:
            with _single_process_quiet(not g.active):
                dcp.load(
                    dcp_state(parts),
                    storage_reader=SafeFileSystemReader(str(folder)),
                    planner=WeightsOnlyLoadPlanner(),
                    process_group=g.pg,
                    no_dist=not g.active,
                )
        except CheckpointException as e:  # DCP raised it on every rank alike
            raise BadInputError(
                f"checkpoint step {step} does not fit the state passed: {failure_text(e)}",
                "resume with the same model and optimizer the checkpoint was saved with",
            ) from e
        rest = [p for p in parts if p.kind not in DCP_KINDS]
        return self.rest_layout.read(folder, rest, state, step)


@contextlib.contextmanager
def _single_process_quiet(single: bool) -> Iterator[None]:
    """DCP warns on every single-process call that it assumes one process: we know."""
    with warnings.catch_warnings():
        if single:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _dicts(findings: list[Finding]) -> list[dict]:
    return [f.to_dict() for f in findings]
