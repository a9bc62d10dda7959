"""The run dir: its layout, write access, and the recipe it was started with.

RUN_DIR/
  .lock             held by the run for its whole life (util/runlock.py): pid, host, start time
  recipe.yaml       the resolved recipe (train.max_steps updated on resume)
  tokenizer.json    the tokenizer the run trains with
  metrics.jsonl     step, eval, finding and event rows
  run.json          the run record's header: environment, recipe, data order, checkpoints
                    (metrics/record.py; docs/run-record.md)
  checkpoints/      step-<N>/ verified checkpoints (unless checkpoint.dir points elsewhere);
                    quarantine/ holds steps that failed verification (never deleted)
  report.html, report.md, batches/step-<N>.html (the batch of each guard decision)
  attic/<time>/     a previous run, set aside by `trainguard run --fresh`
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trainguard.config.load import (
    RECIPE_FILE,
    RESUMABLE_KEYS,
    read_run_recipe,
    recipe_diff,
    recipe_to_dict,
    validate_recipe,
)
from trainguard.errors import ResumeMismatchError, RunDirBusyError, StorageError, TrainguardError
from trainguard.guard.watchdog import remove_unused_backstops
from trainguard.util.atomic import atomic_write_text
from trainguard.util.nofollow import refuse_links_before_start
from trainguard.util.processes import pid_alive
from trainguard.util.runlock import HOLDER_ENV, LOCK_FILE, FolderLock, held_by

if TYPE_CHECKING:
    from trainguard.train.world import Dist

_ERRORS: dict[str, type[TrainguardError]] = {
    "RunDirBusyError": RunDirBusyError,
    "StorageError": StorageError,
}


@contextlib.contextmanager
def hold_run_dir(run_dir: Path, dist: Dist) -> Iterator[FolderLock | None]:
    """The run dir's lock, held once per job for the life of the block.

    Rank 0 takes it, unless the process that launched the job holds it already (`run --nproc`
    names itself in TRAINGUARD_LOCK_HOLDER; its workers must not wait on their own launcher).
    A worker whose named launcher does not hold it refuses: the launcher has ended, and the
    lock would no longer cover the job (its workers end with it: util/processes.py).
    The other ranks take nothing and learn rank 0's verdict, so that a refused job stops on
    every rank at once rather than leaving ranks waiting in a collective.
    """
    lock, refused = None, None
    launcher = os.environ.get(HOLDER_ENV, "")
    if dist.world.rank == 0:
        try:
            lock = FolderLock(run_dir, "trainguard run").acquire()
        except RunDirBusyError as e:
            if not (launcher.isdigit() and held_by(run_dir / LOCK_FILE, int(launcher))):
                refused = (type(e).__name__, e.message, e.fix)
        except StorageError as e:
            refused = (type(e).__name__, e.message, e.fix)
        else:
            # The launcher named as holder does not hold it and has ended: its workers must
            # not write. (Alive, it launched this process for another run dir: a nested run.)
            if launcher.isdigit() and not pid_alive(int(launcher)):
                lock.release()
                lock = None
                refused = (
                    "RunDirBusyError",
                    f"{run_dir}'s lock is not held by the process that launched this job "
                    f"(pid {launcher}, in {HOLDER_ENV}): it has ended, and its workers must not "
                    "write without it",
                    "start the job again with `trainguard run --nproc N` (it resumes from the "
                    f"last checkpoint); {HOLDER_ENV} is for its workers only",
                )
    refused = dist.broadcast_object(refused)
    if refused is not None:
        kind, message, fix = refused
        raise _ERRORS[kind](message, fix)
    if lock is not None:  # no watchdog of this run dir runs now: the others are killed runs'
        remove_unused_backstops(run_dir)
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


# What a run writes or moves in its run dir: a link (or FIFO, device) at any of these is
# refused before anything starts, never written through (util/nofollow.py).
RUN_FILES = (
    RECIPE_FILE,
    "tokenizer.json",
    "metrics.jsonl",
    "preflight_cache.json",
    "report.html",
    "report.md",
    "run.json",
    "batches",
    "attic",
    "checkpoints/quarantine",
    "checkpoints/attic",
)


def ensure_writable(run_dir: Path) -> None:
    """Create the run dir and prove we can write there, before any expensive work; refuse
    links where the run's own files go (BadInputError, exit 2)."""
    refuse_links_before_start(run_dir, RUN_FILES, f"run dir {run_dir}")
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
    previous = _with_defaults(read_run_recipe(run_dir))
    changed = {k: v for k, v in recipe_diff(previous, recipe).items() if k not in RESUMABLE_KEYS}
    if changed:
        listing = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
        raise ResumeMismatchError(
            f"run dir {run_dir} holds a run of a different recipe ({listing})",
            "resume with the same recipe (only train.max_steps and train.schedule_on_extend, "
            "the metrics.* and reference.* keys, preflight.doctor, checkpoint.async_save, "
            "checkpoint.queue and checkpoint.when_full may change), "
            "or start a new run with --run-dir NEW_DIR",
        )
    return True


def _with_defaults(previous: dict[str, Any]) -> dict[str, Any]:
    """The stored recipe as this release reads it: a key added to the schema since the run
    started takes its default, which is what the run computed with (a key that changed what
    a step computes gets a default that keeps the old behaviour). One that no longer
    validates is compared as written: the diff then names what changed."""
    try:
        return recipe_to_dict(validate_recipe(previous, "the run's recipe"))
    except TrainguardError:
        return previous


def write_recipe(run_dir: Path, recipe: dict[str, Any]) -> None:
    atomic_write_text(run_dir / RECIPE_FILE, yaml.safe_dump(recipe, sort_keys=False))
