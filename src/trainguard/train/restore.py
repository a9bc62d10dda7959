"""Where a run starts: the newest checkpoint that verifies and loads, or step 0 on purpose.

Resume and rollback both go through `choose_checkpoint`: the store verifies every checksum and
falls back past damaged steps, and each candidate's files are read and checked against the
model and optimizer without changing them (a file that does not fit is C111, naming it), so a
bad step never leaves a half-loaded model behind. When checkpoints exist but none can be used
the run stops (`refuse_if_none_usable`): starting over would truncate metrics.jsonl and prune
the damaged folders, the run's history and the evidence. Starting over is explicit:
`start_fresh` (`trainguard run --fresh`) moves everything aside into an attic, deleting nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from trainguard.checkpoint.inventory import unloadable
from trainguard.checkpoint.local import ATTIC, free_path
from trainguard.checkpoint.results import LoadedCheckpoint
from trainguard.checkpoint.store import CheckpointStore
from trainguard.codes import get_code
from trainguard.config.schema import Recipe
from trainguard.errors import NoUsableCheckpoint
from trainguard.findings import Finding
from trainguard.train.optim import Optimizer
from trainguard.train.schedule import LrSchedule, resumed_schedule
from trainguard.train.shared_store import checkpoint_root
from trainguard.train.state import RECIPE_FILE
from trainguard.train.state_load import CheckpointContent, UnloadableCheckpoint, read_checkpoint
from trainguard.util.atomic import fsync_dir
from trainguard.util.paths import is_remote
from trainguard.util.runlock import LOCK_FILE

# Never moved by --fresh: the run dir's lock (LOCK_FILE, held by the running command) and the
# attic.


@dataclass
class Chosen:
    """The checkpoint to start from (None: step 0) and what was found on the way."""

    loaded: LoadedCheckpoint | None
    content: CheckpointContent | None
    findings: list[Finding] = field(default_factory=list)


def choose_checkpoint(store: Any, model: Any, optimizer: Optimizer | None) -> Chosen:
    """The newest checkpoint of `store` (a CheckpointStore or SharedStore) whose files verify
    and fit `model` and `optimizer`; neither is changed (see `apply_checkpoint`)."""
    contents: dict[int, CheckpointContent] = {}

    def usable(loaded: LoadedCheckpoint) -> list[Finding]:
        try:
            contents[loaded.step] = read_checkpoint(loaded.path, model, optimizer, loaded.step)
        except UnloadableCheckpoint as e:
            return [unloadable(loaded.step, loaded.path, e.file, e.why)]
        return []

    loaded = store.load_latest(usable=usable)
    if loaded is None:
        return Chosen(None, None, list(store.last_findings))
    return Chosen(loaded, contents[loaded.step], list(loaded.findings))


def refuse_if_none_usable(chosen: Chosen) -> None:
    """NoUsableCheckpoint (exit 1) when checkpoints exist but none can be used (C107)."""
    none = [f for f in chosen.findings if f.code == "C107"]
    if chosen.loaded is None and none:
        raise NoUsableCheckpoint(
            f"C107: {none[0].message}; nothing was changed (metrics.jsonl and the checkpoint "
            "folders are as they were)",
            get_code("C107").fix,
            findings=chosen.findings,
        )


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def set_aside_run_dir(run_dir: Path, stamp: str) -> Path | None:
    """Move everything in `run_dir` but the lock file and the attic to
    `run_dir/attic/<stamp>/`; returns that folder, None if there was nothing to move."""
    if not run_dir.is_dir():
        return None
    entries = sorted(e for e in run_dir.iterdir() if e.name not in (LOCK_FILE, ATTIC))
    if not entries:
        return None
    dest = free_path(run_dir / ATTIC / stamp)
    dest.mkdir(parents=True)
    for entry in entries:
        os.rename(entry, dest / entry.name)
    fsync_dir(dest)
    fsync_dir(run_dir)
    return dest


def start_fresh(recipe: Recipe, run_dir: Path) -> list[Finding]:
    """`trainguard run --fresh`: set the previous run aside (run dir contents, and the step
    folders of a checkpoint.dir outside the run dir) so the run starts at step 0; C113 says
    where it went. Call it in one process only (the launcher, or rank 0)."""
    stamp = _stamp()
    moved = set_aside_run_dir(run_dir, stamp)
    where = [str(moved)] if moved else []
    root = checkpoint_root(recipe, run_dir)
    local = None if is_remote(root) else Path(root.removeprefix("file://")).expanduser()
    inside = local is not None and local.resolve().is_relative_to(run_dir.resolve())
    if not inside and (local is None or local.is_dir()):
        store = CheckpointStore(
            root,
            keep=recipe.checkpoint.keep,
            storage_options=getattr(recipe.checkpoint, "storage_options", None) or None,
        )
        if store.set_aside(stamp):
            where.append(f"{root.rstrip('/')}/{ATTIC}/{stamp}")
    if not where:
        return []
    return [
        Finding.of(
            "C113",
            f"started over on purpose (--fresh): the previous run was moved to {', '.join(where)}",
            where=where[0],
            data={"moved_to": where},
        )
    ]


def schedule_to_resume(recipe: Recipe, chosen: Chosen) -> tuple[LrSchedule, list[Finding]]:
    """The LR schedule of a run resuming from `chosen` (the recipe's cosine on a fresh start)
    and R620 when train.max_steps changed since that checkpoint; ConfigError (exit 2) when it
    is below the checkpoint's step. Checked in setup, before the run dir is written."""
    t = recipe.train
    if chosen.loaded is None or chosen.content is None:
        return LrSchedule.planned(t.warmup_steps, t.min_lr_ratio, t.max_steps), []
    saved = chosen.content.trainer.schedule
    planned = None if saved else _checkpoint_max_steps(chosen.loaded.path)
    return resumed_schedule(t, chosen.loaded.step, saved, planned)


def _checkpoint_max_steps(folder: Path) -> int | None:
    """train.max_steps of a checkpoint's recipe.yaml (written before schedules were saved);
    None when it cannot be read: the plan is then taken to be the current max_steps."""
    try:
        doc = yaml.safe_load((Path(folder) / RECIPE_FILE).read_text(encoding="utf-8"))
        value = doc["train"]["max_steps"]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError):
        return None
    return value if type(value) is int and value >= 1 else None
