"""What the store and the Checkpointer hand back: the result of a save, a loaded checkpoint,
async save handles."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.findings import Finding


@dataclass
class CheckpointInfo:
    """What a save did. `location` is the step folder or URL; `written` is False on ranks that
    do not write (only rank 0 writes)."""

    step: int
    location: str
    manifest: dict[str, Any]
    bytes: int = 0
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    written: bool = True


@dataclass
class LoadedCheckpoint:
    """A verified checkpoint in a LOCAL folder (remote ones are downloaded into the cache)."""

    step: int
    path: Path
    manifest: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    from_cache: bool = False


class SaveHandle:
    """The Future-like result of `save_async`: `result()` blocks for the CheckpointInfo (or
    raises the save's StorageError); `stall_s` is how long the caller was blocked."""

    def __init__(self, future: Future[CheckpointInfo], stall_s: float) -> None:
        self.future, self.stall_s = future, stall_s

    def result(self, timeout: float | None = None) -> CheckpointInfo:
        return self.future.result(timeout)

    def done(self) -> bool:
        return self.future.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self.future.exception(timeout)


class AsyncSave:
    """The handle `save` returns with `async_save=True`. `wait()` returns the checkpoint's
    path or raises the error of the background write (None for a skipped save); `stall_s` is
    how long `save` blocked (with `background_copy`, the caller's later `wait_copied` is not in
    it), `waited_s` the part of it spent waiting for room in the queue. `queued`: how many
    earlier writes were held when it was queued (0: the writer was free); `skipped`: True when
    the queue was full and nothing was saved (`when_full="skip"`, C124 in `findings`);
    `findings`: the save's, once it is done."""

    def __init__(
        self,
        future: Future[str],
        stall_s: float,
        *,
        step: int | None = None,
        findings: list[Finding] | None = None,
    ) -> None:
        self.future, self.stall_s = future, stall_s
        self.step = step
        self.findings: list[Finding] = findings if findings is not None else []
        self.observed = False
        self.waited_s = 0.0
        self.queued = 0
        self.skipped = False
        self.slot = 0  # the layout's copy buffers it reads (`SaveQueue.free_slot`)

    def wait(self, timeout: float | None = None) -> str:
        self.observed = True
        return self.future.result(timeout)

    def done(self) -> bool:
        return self.future.done()
