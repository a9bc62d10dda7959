"""The checks that can refuse `trainguard run` once its checkpoint is chosen, all made before
the run's first write, so that a refused run leaves its run dir byte-identical:

- `refuse_lost_history`: the log says checkpoints were committed, yet none is left (C107):
  starting at step 0 would cut metrics.jsonl back and train the run again, silently
  (`refuse_missing_root`: the same, found before the checkpoint folder is opened);
- `refuse_blocked_paths`: where this run will save a step (or set a damaged one aside) sits
  something that is not trainguard's folder: a symlink, a file. Saving would write through the
  link or fail after the steps before it were trained again, on every relaunch;
- `refuse_blocked_attic`: `--fresh` would move the previous run into RUN_DIR/attic/ through a
  link, or fail half-way.

`refuse_to_start` makes the first two once the checkpoint is chosen. `on_main` runs a check on
rank 0 only (the process that writes) and raises its refusal on every rank, so that no rank is
left waiting in a collective.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.checkpoint.local import ATTIC, QUARANTINE
from trainguard.checkpoint.manifest import parse_step_dirname
from trainguard.codes.checkpoint import C107_IN_RUN
from trainguard.errors import BadInputError, NoUsableCheckpoint, TrainguardError
from trainguard.findings import Finding
from trainguard.metrics.jsonl import METRICS_FILE, read_metrics
from trainguard.train.saving import checkpoint_due
from trainguard.util.paths import is_remote, local_path

if TYPE_CHECKING:
    from trainguard.config.schema import Recipe
    from trainguard.train.world import Dist

CHECKPOINT_EVENT = "checkpoint"
"""The event row a committed checkpoint logs (`{"kind": "event", "event": "checkpoint",
"step": N, "path": ...}`): the log's own record that the run dir has a checkpoint to lose."""
_COMMITTED = (CHECKPOINT_EVENT, "end")  # a finished run saved its last step (run dirs before)


def on_main(dist: Dist, check: Callable[[], None]) -> None:
    """Run `check` on rank 0; its refusal (a TrainguardError) is raised on every rank."""
    refused: TrainguardError | None = None
    if dist.world.rank == 0:
        try:
            check()
        except TrainguardError as e:
            refused = e
    refused = dist.broadcast_object(refused)  # our own processes: a pickled exception is fine
    if refused is not None:
        raise refused


def refuse_to_start(recipe: Recipe, run_dir: Path, root: str, step: int | None) -> None:
    """The checks made once the run's checkpoint is chosen (`step`; None: none, step 0)."""
    if step is None:
        refuse_lost_history(run_dir, root)
    refuse_blocked_paths(recipe, root, step or 0)


def refuse_lost_history(run_dir: Path, root: str) -> None:
    """C107 (exit 1) when no checkpoint is left in `root` although RUN_DIR/metrics.jsonl
    records a committed one (a `checkpoint` event, or the `end` of a finished run). A run that
    crashed before its first checkpoint has none to lose: it starts at step 0, as it did."""
    steps = [
        row["step"]
        for row in read_metrics(run_dir)
        if row.get("kind") == "event"
        and row.get("event") in _COMMITTED
        and type(row.get("step")) is int
        and row["step"] > 0
    ]
    if not steps:
        return
    log = run_dir / METRICS_FILE
    message = (
        f"C107: {log} records a run with checkpoints up to step {max(steps)}, but the "
        f"checkpoint folder {root} holds none (deleted or moved?); starting over at step 0 "
        "would rewrite the run's history; nothing was changed"
    )
    finding = Finding.of("C107", message, where=root, data={"logged_step": max(steps)})
    raise NoUsableCheckpoint(message, C107_IN_RUN, findings=[finding])


def refuse_missing_root(run_dir: Path, root: str) -> None:
    """`refuse_lost_history` when the local checkpoint folder `root` itself is gone (before the
    run opens it, which creates it: a refused run adds nothing to the run dir either)."""
    if not is_remote(root) and not os.path.lexists(local_path(root)):
        refuse_lost_history(run_dir, root)


def _what(path: Path) -> str:
    if path.is_symlink():
        return f"a symbolic link (to {os.readlink(path)})"
    return "a file" if path.is_file() else "not a folder"


def _not_a_folder(path: Path) -> bool:
    return os.path.lexists(path) and (path.is_symlink() or not path.is_dir())


def refuse_blocked_paths(recipe: Recipe, root: str, start: int) -> None:
    """BadInputError (exit 2, before any step) when, in a local checkpoint root, `quarantine`
    or a `step-N` this run will save (N after `start`, on the checkpoint schedule) is a
    symlink or not a folder. Other junk stays ignored (C110): the run never writes there."""
    if is_remote(root):
        return
    folder = local_path(root)
    quarantine = folder / QUARANTINE
    if _not_a_folder(quarantine):
        raise BadInputError(
            f"{quarantine} is {_what(quarantine)}, not the folder trainguard sets damaged "
            "checkpoints aside in; nothing was started",
            f"move {quarantine} out of {folder} (trainguard creates the folder itself when it "
            "needs it) and run again",
        )
    t = recipe.train
    entries = sorted(folder.iterdir()) if folder.is_dir() else []  # the root may be a link
    for entry in entries:
        n = parse_step_dirname(entry.name)
        if n is None or not start < n <= t.max_steps or not checkpoint_due(recipe, n):
            continue
        if _not_a_folder(entry):
            raise BadInputError(
                f"{entry} is {_what(entry)}, not a step folder, and this run saves step {n} "
                "there; trainguard never writes through a link or over a file; nothing was "
                "started",
                f"move {entry} out of {folder} (to keep a checkpoint, put the folder itself in "
                "its place) and run again",
            )


def refuse_blocked_attic(folder: Path) -> None:
    """`--fresh` moves the previous run into `folder/attic/` (the run dir's, and a local
    checkpoint.dir's outside it): refuse when that is a symlink or a file (BadInputError,
    exit 2), before anything moved."""
    attic = folder / ATTIC
    if _not_a_folder(attic):
        raise BadInputError(
            f"{attic} is {_what(attic)}, not the folder --fresh sets the previous run aside in; "
            "nothing was moved",
            f"move {attic} out of {folder} and run again",
        )
