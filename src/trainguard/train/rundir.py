"""The run dir: its layout, write access, and the recipe it was started with.

RUN_DIR/
  recipe.yaml       the resolved recipe (train.max_steps updated on resume)
  tokenizer.json    the tokenizer the run trains with
  metrics.jsonl     step, eval, finding and event rows
  checkpoints/      step-<N>/ verified checkpoints (unless checkpoint.dir points elsewhere);
                    quarantine/ holds steps that failed verification (never deleted)
  report.html, report.md
  attic/<time>/     a previous run, set aside by `trainguard run --fresh`
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from trainguard.config.load import RESUMABLE_KEYS, recipe_diff
from trainguard.errors import ResumeMismatchError, StorageError
from trainguard.util.atomic import atomic_write_text

RECIPE_FILE = "recipe.yaml"


def ensure_writable(run_dir: Path) -> None:
    """Create the run dir and prove we can write there, before any expensive work."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        # mkstemp: an unpredictable name opened with O_EXCL, so a planted symlink is never
        # followed.
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=run_dir)
        try:
            os.write(fd, b"ok")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)
        hint = "free some space" if e.errno == errno.ENOSPC else "choose a writable folder"
        raise StorageError(
            f"cannot write to run dir {run_dir}: {reason}",
            f"{hint}, e.g. --run-dir /tmp/trainguard-run",
        ) from None


def check_resume_recipe(run_dir: Path, recipe: dict[str, Any]) -> bool:
    """Refuse to resume a run dir with a different recipe; True if a previous recipe exists."""
    path = run_dir / RECIPE_FILE
    if not path.exists():
        return False
    previous = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    changed = {k: v for k, v in recipe_diff(previous, recipe).items() if k not in RESUMABLE_KEYS}
    if changed:
        listing = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
        raise ResumeMismatchError(
            f"run dir {run_dir} holds a run of a different recipe ({listing})",
            "resume with the same recipe (only train.max_steps and the metrics.* keys may change), "
            "or start a new run with --run-dir NEW_DIR",
        )
    return True


def write_recipe(run_dir: Path, recipe: dict[str, Any]) -> None:
    atomic_write_text(run_dir / RECIPE_FILE, yaml.safe_dump(recipe, sort_keys=False))
