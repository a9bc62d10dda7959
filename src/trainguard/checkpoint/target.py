"""A command's checkpoint argument (`eval`, `check-tokenizer --checkpoint`, `report`): a run
dir or one checkpoint folder, always through verification.

A run dir gives its newest checkpoint that verifies and passes the caller's `usable` check,
falling back past damaged ones (their findings come along). One checkpoint folder is verified
alone: damage is the answer, there is nothing to fall back to. Nothing is moved or deleted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from trainguard.checkpoint.folder import inspect_local_folder, read_manifest
from trainguard.checkpoint.manifest import MANIFEST, UnsafeEntry, parse_step_dirname
from trainguard.checkpoint.results import LoadedCheckpoint
from trainguard.checkpoint.store import CheckpointStore
from trainguard.errors import BadInputError
from trainguard.findings import Finding, has_errors
from trainguard.util.paths import is_remote, local_path

RUN_RECIPE = "recipe.yaml"
Usable = Callable[[LoadedCheckpoint], list[Finding]]


def _checkpoint_section(run_dir: Path) -> dict:
    try:
        doc = yaml.safe_load((run_dir / RUN_RECIPE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        doc = None
    section = doc.get("checkpoint") if isinstance(doc, dict) else None
    return section if isinstance(section, dict) else {}


def run_checkpoint_root(run_dir: Path) -> str:
    """Where a run dir's checkpoints live: its recipe's checkpoint.dir, else RUN_DIR/checkpoints."""
    configured = _checkpoint_section(run_dir).get("dir")
    return str(configured) if configured else str(run_dir / "checkpoints")


def is_checkpoint_folder(path: Path) -> bool:
    """A step folder (a manifest, or the canonical step-<N> name), not a run dir."""
    return path.is_dir() and (
        (path / MANIFEST).exists() or (path / MANIFEST).is_symlink() or _named_step(path)
    )


def _named_step(path: Path) -> bool:
    return parse_step_dirname(path.name) is not None


def _manifest_step(folder: Path) -> int:
    """The step a folder's manifest names (for a copy under another name); -1 if unreadable,
    which verification then reports."""
    try:
        doc = json.loads(read_manifest(folder) or b"null")
    except (UnsafeEntry, ValueError):
        return -1
    step = doc.get("step") if isinstance(doc, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else -1


def _single(folder: Path, usable: Usable | None) -> tuple[LoadedCheckpoint | None, list[Finding]]:
    step = parse_step_dirname(folder.name)
    step = step if step is not None else _manifest_step(folder)
    manifest, findings = inspect_local_folder(folder, step)
    if manifest is None or has_errors(findings):
        return None, findings
    loaded = LoadedCheckpoint(step, folder, manifest, findings)
    problems = usable(loaded) if usable is not None else []
    loaded.findings = findings + problems
    return (None if has_errors(problems) else loaded), loaded.findings


def open_checkpoint(
    target: str | Path, usable: Usable | None = None
) -> tuple[LoadedCheckpoint | None, list[Finding]]:
    """(the verified checkpoint, findings) for a run dir or a checkpoint folder; None when
    nothing usable was found (the findings say why: C101-C111, C107 for a run dir).
    BadInputError when `target` is neither or holds no checkpoint at all."""
    target = Path(target)
    if not target.exists():
        raise BadInputError(
            f"{target} does not exist", "give a run dir or a checkpoint folder (step-<N>/)"
        )
    if not target.is_dir():
        raise BadInputError(
            f"{target} is a file, not a run dir or a checkpoint folder",
            "give a run dir or a checkpoint folder (step-<N>/)",
        )
    if is_checkpoint_folder(target):
        return _single(target, usable)
    root = run_checkpoint_root(target)
    if not is_remote(root) and not local_path(root).is_dir():
        raise BadInputError(
            f"{target} has no checkpoints ({root} does not exist)",
            "train the run first, or give a checkpoint folder (step-<N>/)",
        )
    options = _checkpoint_section(target).get("storage_options")
    store = CheckpointStore(root, storage_options=options if isinstance(options, dict) else None)
    loaded = store.load_latest(usable)
    if loaded is not None:
        return loaded, loaded.findings
    if not has_errors(store.last_findings):
        raise BadInputError(
            f"{target} has no checkpoint (no step-<N>/ folder with a manifest under {root})",
            "train the run first, or give a checkpoint folder (step-<N>/)",
        )
    return None, store.last_findings
