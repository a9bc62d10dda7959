"""How a Checkpointer loads: rank 0 picks the newest step that verifies and fits the caller's
state (falling back past damaged ones), every rank fetches that step (remote: once per machine,
into the node cache) and restores it in place, then its generator states. `CheckpointLoading`
is the Checkpointer's loading half (checkpointer.py holds the saving half and the threads).

A step written by `trainguard run` before it used the Checkpointer's format (layout
"trainguard-run/1", or a manifest without a "checkpointer" entry beside a trainer.json) is
refused, not passed over: `LegacyRunCheckpoint` (exit 2) names the command that converts the
run dir without losing anything (train/convert_checkpoints.py).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.checkpoint.failures import failure_text
from trainguard.checkpoint.group import CheckpointGroup
from trainguard.checkpoint.layout import Layout, Part, check_keys, classify
from trainguard.checkpoint.load_checks import (
    check_payload,
    name_rank,
    refuse_if_none_usable,
    restore_generators,
    same_manifest,
    unlisted,
)
from trainguard.checkpoint.results import LoadedCheckpoint
from trainguard.checkpoint.store import CheckpointStore
from trainguard.errors import BadInputError, StorageError
from trainguard.findings import Finding

if TYPE_CHECKING:
    from trainguard.checkpoint.sharded import ShardedIO

log = logging.getLogger("trainguard.checkpoint")
FORMAT = 1
LEGACY_RUN_LAYOUT = "trainguard-run/1"
CONVERT = "trainguard checkpoint convert"


class LegacyRunCheckpoint(BadInputError):
    """A step of `trainguard run`'s format before this release: refused with the fix."""

    def __init__(self, step: int, root: str, run_dir: str = "RUN_DIR") -> None:
        super().__init__(
            f"checkpoint step {step} in {root} was written by an earlier trainguard release "
            "in `trainguard run`'s own format (model.safetensors, optimizer.pt, trainer.json, "
            "...); checkpoints are now in the one format every loop gets (state.json + "
            "state.safetensors), so nothing was loaded and nothing was changed",
            f"convert the run dir once (its old step folders go to the attic, nothing is "
            f"deleted), then run again: {CONVERT} {run_dir}",
        )
        self.step, self.root = step, root


def is_legacy_run_step(manifest: dict[str, Any]) -> bool:
    """A step `trainguard run` wrote before it used the Checkpointer's format."""
    meta = manifest.get("meta")
    info = meta.get("checkpointer") if isinstance(meta, dict) else None
    if isinstance(info, dict):
        return info.get("layout") == LEGACY_RUN_LAYOUT
    files = manifest.get("files")
    return isinstance(files, dict) and "trainer.json" in files


class CheckpointLoading:
    """`load_latest` and what it needs; the Checkpointer sets these attributes."""

    root: str
    group: CheckpointGroup
    store: CheckpointStore
    layout: Layout
    last_findings: list[Finding]
    last_path: Path | None
    last_meta: dict[str, Any]
    _housekeeping: list[Future[None]]

    @property
    def sharded_io(self) -> ShardedIO:
        raise NotImplementedError

    def _drain(self) -> None:
        raise NotImplementedError

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
        an error finding passes the step over). A step of `trainguard run`'s earlier format is
        refused (LegacyRunCheckpoint) with the command that converts it."""
        found = check_payload(loaded)  # a sharded step: every file DCP would read is listed
        info = loaded.manifest.get("meta", {}).get("checkpointer") or {}
        if is_legacy_run_step(loaded.manifest):
            raise LegacyRunCheckpoint(loaded.step, self.root)
        if found or info.get("sharded"):
            return found
        # The layout's files must be listed: an unlisted one is never opened (a FIFO there
        # would block the load), so the step is passed over like a damaged one.
        # (A step of another layout is refused by `_restore` before anything is read.)
        mine = info.get("layout") == self.layout.name
        found = unlisted(loaded, getattr(self.layout, "files", ())) if mine else []
        check = getattr(self.layout, "check", None)
        if found or check is None or not mine:
            return found
        if info.get("keys") != {p.key: p.kind for p in parts}:
            return []  # the caller's keys, not the step: `_restore` refuses it (bad input)
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
        if not isinstance(info, dict) or info.get("format") != FORMAT:
            raise BadInputError(
                f"checkpoint step {step} in {self.root} was not written by a Checkpointer "
                "(its manifest has no 'checkpointer' entry of this format)",
                "point the Checkpointer at a folder only Checkpointers write to",
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


def _dicts(findings: list[Finding]) -> list[dict]:
    return [f.to_dict() for f in findings]


def _findings(dicts: list[dict]) -> list[Finding]:
    return [Finding.from_dict(d) for d in dicts]
