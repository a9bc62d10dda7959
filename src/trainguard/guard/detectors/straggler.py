"""H202: stragglers, a rank that computes much slower than the others and than it used to.

In data parallelism every rank waits for the slowest in the gradient all-reduce, so the wall
time of a step is the same everywhere and says nothing about who is slow. What differs is how
the time is spent: the slow rank is busy, the others wait. `PhaseTimer` therefore measures, per
phase of the step, the *busy* time of the training thread (`time.thread_time`, CPU seconds)
and books the rest of the wall time as *communication* (waiting in collectives, or for the
CPU):

    data       reading and slicing the global batch          busy seconds
    fwd_bwd    forward and backward over the micro-batches   busy seconds
    optimizer  clipping, loss reduction, the update          busy seconds
    comm       wall time of the step minus the busy time     seconds waited

Every K steps the ranks all-gather their sums, and `StragglerMonitor.update` scores each rank's
busy time per step two ways:

    vs_fastest = min over ranks of busy / this rank's busy   (1.0 for the fastest rank)
    vs_history = this rank's median busy over its last `history` healthy intervals / now

A rank is named when BOTH scores are below `threshold` (default 0.5: twice as slow as the
fastest rank and as itself before). The first condition ignores a whole job slowing down
(a bigger batch, a shared machine); the second ignores a rank that was always slower (a
heterogeneous cluster), which is a placement problem, not a failing chip. The first interval
has no history and never fires. Flagged intervals are kept out of the history, so a persistent
straggler stays named; it is reported once per episode and re-armed when it recovers.

Busy time is CPU time of the Python training thread: right on CPU with `train.threads=1`; with
intra-op thread pools or on a GPU it covers only the host side of the work.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from trainguard.findings import Finding

PHASE_GROUPS = {
    "data": "data",
    "forward": "fwd_bwd",
    "backward": "fwd_bwd",
    "optimizer": "optimizer",
}
BUSY = ("data", "fwd_bwd", "optimizer")


class PhaseTimer:
    """Accumulates busy seconds per phase group and waited seconds, over a number of steps."""

    def __init__(
        self,
        cpu_clock: Callable[[], float] = time.thread_time,
        wall_clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.cpu_clock, self.wall_clock = cpu_clock, wall_clock
        self.current: str | None = None
        self._cpu = self._wall = 0.0
        self.reset()

    def reset(self) -> None:
        self.busy = dict.fromkeys(BUSY, 0.0)
        self.wall = 0.0
        self.steps = 0

    def _book(self) -> None:
        cpu, wall = self.cpu_clock(), self.wall_clock()
        if self.current is not None:
            self.busy[self.current] += cpu - self._cpu
            self.wall += wall - self._wall
        self._cpu, self._wall = cpu, wall

    def mark(self, phase: str) -> None:
        """The loop enters `phase`; phases outside PHASE_GROUPS (eval, checkpoint) pause it."""
        self._book()
        self.current = PHASE_GROUPS.get(phase)

    def end_step(self) -> None:
        self._book()
        self.current = None
        self.steps += 1

    def take(self) -> dict[str, float]:
        """The interval's sums (seconds) and step count; starts a new interval."""
        busy = sum(self.busy.values())
        out = {**self.busy, "comm": max(0.0, self.wall - busy), "steps": float(self.steps)}
        self.reset()
        return out


def busy_per_step(timing: dict[str, float]) -> float:
    return sum(timing.get(k, 0.0) for k in BUSY) / max(timing.get("steps", 0.0), 1.0)


class StragglerMonitor:
    code = "H202"

    def __init__(self, threshold: float = 0.5, history: int = 8) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError("threshold must be in (0, 1]")
        self.threshold = threshold
        self.history_len = history
        self.history: dict[int, deque[float]] = {}
        self.flagged: set[int] = set()

    def scores(self, busy: list[float]) -> list[tuple[float, float | None]]:
        """(vs_fastest, vs_history) per rank; vs_history is None without history."""
        fastest = min(busy)
        out = []
        for r, b in enumerate(busy):
            vs_fastest = fastest / b if b > 0 else 1.0
            hist = self.history.get(r)
            vs_history = statistics.median(hist) / b if hist and b > 0 else None
            out.append((vs_fastest, vs_history))
        return out

    def update(
        self, step: int, timings: list[dict[str, float]], hosts: list[str] | None = None
    ) -> list[Finding]:
        """Score one interval of every rank's timings (index = rank); H202 per new straggler."""
        if len(timings) < 2 or any(t.get("steps", 0) <= 0 for t in timings):
            return []
        busy = [busy_per_step(t) for t in timings]
        hosts = hosts or ["?"] * len(timings)
        findings = []
        for r, (vs_fastest, vs_history) in enumerate(self.scores(busy)):
            slow = (
                vs_fastest < self.threshold
                and vs_history is not None
                and vs_history < self.threshold
            )
            if not slow:
                self.flagged.discard(r)
                self.history.setdefault(r, deque(maxlen=self.history_len)).append(busy[r])
                continue
            if r in self.flagged:
                continue
            self.flagged.add(r)
            fastest = min(range(len(busy)), key=busy.__getitem__)
            findings.append(
                Finding.of(
                    "H202",
                    f"rank {r} ({hosts[r]}) is a straggler: {busy[r] * 1e3:.1f} ms busy per "
                    f"step against {busy[fastest] * 1e3:.1f} ms on the fastest rank {fastest} "
                    f"(score {vs_fastest:.2f}) and {vs_history:.2f} of its own history "
                    f"(threshold {self.threshold})",
                    step=step,
                    rank=r,
                    where=hosts[r],
                    data={
                        "score_vs_fastest": round(vs_fastest, 4),
                        "score_vs_history": round(vs_history, 4),
                        "busy_s_per_step": [round(b, 6) for b in busy],
                        "timings": timings,
                        "threshold": self.threshold,
                    },
                )
            )
        return findings

    def state_dict(self) -> dict[str, Any]:
        return {
            "history": {str(r): list(h) for r, h in self.history.items()},
            "flagged": sorted(self.flagged),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = {
            int(r): deque(h, maxlen=self.history_len) for r, h in state.get("history", {}).items()
        }
        self.flagged = set(state.get("flagged", []))
