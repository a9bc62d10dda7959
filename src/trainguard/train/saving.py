"""Checkpoints of `trainguard run`'s loop through its `Checkpointer` (train/run_state.py): when due,
every rank takes part and rank 0 writes. With `checkpoint.async_save` (the default) the loop
stops only to copy its small state (counters, the sampler, generator states) and to queue the
copy of the weights and the optimizer state; a background thread makes that copy while the
next step's forward and backward run (the step waits for it before its update), then writes,
verifies and prunes. Up to `checkpoint.queue` snapshots are held at once (the one being
written included): a save waits for the oldest write only when the queue is full, or with
`checkpoint.when_full: skip` is skipped (C124) instead; the last save of the run always waits.
A write's findings are recorded and the callbacks hear of it (`post_checkpoint`) once it is
committed, in the order of the saves: at a later save that finds it done, or when the loop
waits for it (a full queue, a rollback, the end of the loop: `finish_checkpoint`).

A save that cannot be written (a full disk, a file size limit, a store that stops answering)
ends the run with exit 1 (OutputWriteError: an output could not be written), not 2: the input
was fine, and training ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trainguard.checkpoint.results import AsyncSave
from trainguard.errors import OutputWriteError, StorageError

if TYPE_CHECKING:
    from trainguard.config.schema import Recipe
    from trainguard.train.loop import Loop


def checkpoint_due(recipe: Recipe, completed: int) -> bool:
    """Whether the run saves once `completed` steps are done (after step index `completed - 1`):
    every `checkpoint.interval` steps and at the end."""
    return completed % recipe.checkpoint.interval == 0 or completed == recipe.train.max_steps


def checkpoint_queue(recipe: Recipe) -> dict[str, Any]:
    """The Checkpointer's `queue` and `when_full` for the recipe (only an async save has a
    queue)."""
    c = recipe.checkpoint
    if not c.async_save:
        return {"queue": 1, "when_full": "wait"}
    return {"queue": c.queue, "when_full": c.when_full}


def save_checkpoint(loop: Loop, step: int) -> None:
    """The checkpoint after step `step` (0-based): `step + 1` completed steps. Every rank
    takes part; rank 0 writes (temp name, manifest last, rename). In the
    background by default (`checkpoint.async_save`): the loop waits only for room in the queue
    (`checkpoint.queue`; never with `when_full: skip` but at the last save) and for its small
    state to be copied (the weights and the optimizer state are copied in the background:
    `spine.train_step` waits for that before its update); a crash mid-write leaves the
    previous checkpoint as it was, and a snapshot still queued is simply not a checkpoint."""
    ctx = loop.ctx
    ctx.set_phase("checkpoint", step)  # fire drills: kill@N:checkpoint strikes here
    checkpointer = loop.checkpointer
    completed = step + 1
    last = completed == ctx.recipe.train.max_steps
    if checkpointer.when_full != "skip" or last:
        with _write_failure():  # with a full queue: the oldest write first (counted)
            checkpointer.make_room()
    settle(loop, hold=len(loop.writing))  # the writes that have ended, in order
    meta = {"tokens_seen": ctx.tokens_seen, **loop.checkpoint_meta}
    with _write_failure():
        saved = checkpointer.save(completed, loop.state, meta=meta, may_skip=not last)
    if isinstance(saved, AsyncSave):
        if saved.skipped:  # the queue was full (C124): the earlier saves are still written
            ctx.record(saved.findings)
        else:
            loop.writing.append((completed, saved))
        return
    ctx.record(checkpointer.last_findings)  # e.g. a damaged step moved to quarantine
    loop.callbacks.post_checkpoint(ctx, completed, str(saved))


def settle(loop: Loop, hold: int) -> None:
    """Record the background writes that have ended, oldest first, waiting for the oldest
    until at most `hold` are left: each one's findings, and the callbacks hear it is
    committed. A failed write's error is raised here."""
    while loop.writing and (len(loop.writing) > hold or loop.writing[0][1].done()):
        step, handle = loop.writing.pop(0)
        with _write_failure():
            path = handle.wait()
        loop.ctx.record(handle.findings)
        loop.callbacks.post_checkpoint(loop.ctx, step, path)


def finish_checkpoint(loop: Loop) -> None:
    """Wait for every checkpoint queued or being written in the background (a failed write's
    error is raised here); record their findings and tell the callbacks they are committed."""
    settle(loop, hold=0)


@contextlib.contextmanager
def _write_failure() -> Iterator[None]:
    """A checkpoint that could not be written is an output not written (exit 1); the storage
    error's words (which step, where, why, the previous checkpoint kept) are kept."""
    try:
        yield
    except OutputWriteError:
        raise
    except StorageError as e:
        raise OutputWriteError(e.message, e.fix) from e
