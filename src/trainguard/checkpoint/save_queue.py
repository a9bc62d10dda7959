"""The asynchronous saves a Checkpointer holds: queued behind the write in progress, or being
written (`Checkpointer(async_save=True, queue=N, when_full=...)`).

With one writer thread a save that comes while the previous one is still being written used to
wait for it: at an interval of a few steps the loop stopped for most of a write at every save.
A queue of `N` lets `N` snapshots be held at once (the one being written included): a save
waits only when `N` are already held. The bound is memory: every held snapshot is a full copy
of the saved state (for `trainguard run`, the weights and the optimizer state, on the device
they live on), so a queue of `N` holds at most `N` copies besides the live state; `N = 1` is the
old behaviour (one copy, each save waits for the previous write). The writes run one at a time
in the order of the saves, so retention still deletes a step only after a newer one is
verified, and a process killed with snapshots queued loses only those: a queued snapshot is not
a checkpoint until its manifest is committed, the previous committed one stays the newest.

`when_full="skip"` makes a save that finds the queue full return at once without saving
(C124, in the handle's findings): the loop never waits for storage, and the checkpoints come
as often as the storage can write them. A save passed `may_skip=False` (the last one of a run)
waits instead. Under torch.distributed the ranks agree on skipping (one collective per save):
one rank saving while another skips would pair their collectives wrongly.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, wait

from trainguard.checkpoint.results import AsyncSave
from trainguard.errors import BadInputError
from trainguard.findings import Finding

WHEN_FULL = ("wait", "skip")


def check_queue(queue: object, when_full: object, async_save: bool) -> None:
    """BadInputError for a queue setting that cannot work (the fix named)."""
    if isinstance(queue, bool) or not isinstance(queue, int) or queue < 1:
        raise BadInputError(
            f"queue={queue!r}", "pass the number of snapshots held at once, an int >= 1"
        )
    if when_full not in WHEN_FULL:
        raise BadInputError(f"when_full={when_full!r}", "pass 'wait' or 'skip'")
    if (queue > 1 or when_full != "wait") and not async_save:
        raise BadInputError(
            f"queue={queue} and when_full={when_full!r} hold snapshots for a background write",
            "pass async_save=True with them, or leave them out",
        )


class SaveQueue:
    """The held saves, oldest first, and what happened to the saves so far (`counts`)."""

    def __init__(self, depth: int = 1, when_full: str = "wait") -> None:
        self.depth, self.when_full = depth, when_full
        self.pending: deque[AsyncSave] = deque()
        self.counts = {"saved": 0, "queued": 0, "waited": 0, "skipped": 0}
        """Saves handed to the writer; of them, queued behind another write (the loop did not
        wait) and that waited for room; saves skipped (C124)."""

    def reap(self) -> None:
        """Forget the writes that have ended, oldest first; raise the first error nobody has
        seen (the writes end in order, so only the front can have ended)."""
        while self.pending and self.pending[0].done():
            _settle(self.pending.popleft())

    def full(self) -> bool:
        self.reap()
        return len(self.pending) >= self.depth

    def make_room(self) -> float:
        """Wait for the oldest writes until a snapshot may be added; the seconds waited."""
        t0 = time.perf_counter()
        if self.full():
            self.counts["waited"] += 1
            while len(self.pending) >= self.depth:
                _settle(self.pending.popleft())
        return time.perf_counter() - t0

    def drain(self) -> None:
        """Wait for every held write; raise the first error nobody has seen."""
        while self.pending:
            _settle(self.pending.popleft())

    def free_slot(self) -> int:
        """A slot (0..depth-1) no held write reads: a layout keeps one set of copy buffers per
        slot (`use_slot`). Called after `make_room`, so one is free."""
        busy = {h.slot for h in self.pending if not h.done()}
        return min(set(range(self.depth)) - busy)

    def add(self, handle: AsyncSave) -> None:
        handle.queued = len(self.pending)
        self.counts["saved"] += 1
        if handle.queued:
            self.counts["queued"] += 1
        self.pending.append(handle)

    def skipped(self, step: int, stall_s: float) -> AsyncSave:
        """The handle of a save not made because the queue was full (C124)."""
        self.counts["skipped"] += 1
        future: Future[str | None] = Future()
        future.set_result(None)
        finding = Finding(
            code="C124",
            severity="info",
            message=f"checkpoint step {step} skipped: {len(self.pending)} earlier save(s) "
            f"still being written and the queue holds {self.depth}",
            fix="nothing is lost (the earlier checkpoints are written); for every save pass "
            "when_full='wait' (checkpoint.when_full: wait), a longer interval, or faster storage",
            step=step,
            data={"held": len(self.pending), "queue": self.depth},
        )
        handle = AsyncSave(future, stall_s, step=step, findings=[finding])  # type: ignore[arg-type]
        handle.skipped = True
        return handle


def _settle(handle: AsyncSave) -> None:
    wait([handle.future])
    error = handle.future.exception()
    if error is not None and not handle.observed:
        handle.observed = True
        raise error
