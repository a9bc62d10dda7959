"""Checkpoints of `trainguard run`'s loop through its `Checkpointer` (train/layout.py): when due,
every rank takes part and rank 0 writes. With `checkpoint.async_save` (the default) the loop
stops only to copy its small state (counters, the sampler, generator states) and to queue the
copy of the weights and the optimizer state; a background thread makes that copy while the
next step's forward and backward run (the step waits for it before its update), then writes,
verifies and prunes. The next save, a rollback and the end of the loop wait for the write
(`finish_checkpoint`): its findings are recorded and the callbacks hear of it
(`post_checkpoint`) once it is committed.

A save that cannot be written (a full disk, a file size limit, a store that stops answering)
ends the run with exit 1 (OutputWriteError: an output could not be written), not 2: the input
was fine, and training ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from trainguard.checkpoint.results import AsyncSave
from trainguard.errors import OutputWriteError, StorageError

if TYPE_CHECKING:
    from trainguard.train.loop import Loop


def save_checkpoint(loop: Loop, step: int) -> None:
    """Every rank takes part; rank 0 writes (temp name, manifest last, rename). In the
    background by default (`checkpoint.async_save`): the loop waits only for the previous
    write to finish and for its small state to be copied (the weights and the optimizer state
    are copied in the writer thread: `spine.train_step` waits for that before its update); a
    crash mid-write leaves the previous checkpoint as it was."""
    ctx = loop.ctx
    loop.faults.at("checkpoint", step)  # fire drills: kill@N:checkpoint
    ctx.set_phase("checkpoint")
    finish_checkpoint(loop)  # one write at a time: the previous one first
    meta = {"tokens_seen": ctx.tokens_seen, **loop.checkpoint_meta}
    with _write_failure():
        saved = loop.checkpointer.save(step, loop.state, meta=meta)
    if isinstance(saved, AsyncSave):
        loop.writing = (step, saved)
        return
    ctx.record(loop.checkpointer.last_findings)  # e.g. a damaged step moved to quarantine
    loop.callbacks.post_checkpoint(ctx, step, str(saved))


def finish_checkpoint(loop: Loop) -> None:
    """Wait for the checkpoint being written in the background, if any (its error, a failed
    write, is raised here); record its findings and tell the callbacks it is committed."""
    if loop.writing is None:
        return
    (step, handle), loop.writing = loop.writing, None
    with _write_failure():
        path = handle.wait()
    loop.ctx.record(loop.checkpointer.last_findings)
    loop.callbacks.post_checkpoint(loop.ctx, step, path)


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
