"""H202: stragglers, a rank the others wait for, named by comparing the ranks at each step.

In data parallelism every rank waits for the slowest in the gradient all-reduce, so the wall
time of a whole step is the same everywhere and says nothing about who is slow. What differs is
*when* each rank arrives at a collective: the slow rank arrives late, the others wait inside
it. `PhaseTimer` therefore records, for every step and every phase of it, the wall time and the
CPU time of the training thread (`time.thread_time`):

    data       reading and slicing the batch
    forward    the forward passes over the micro-batches
    backward   the backward passes (with DDP the gradient all-reduce ends in here)
    optimizer  clipping, the update

From those, at each step, a rank's *arrival* at the end of phase p is its wall time since the
step began, summed over the phases up to p (data, forward, backward, optimizer, in that order):
the time it reaches the collective that phase ends in (the all-reduce, the step barrier). The
steps begin together: after warm-up the part meets every rank at a barrier between steps, so
the arrivals are comparable. A rank's *lag* at p is its arrival minus the median arrival of the
other ranks. A rank slow in its data or forward phase has a lag there; the ranks that waited
for it have none (they arrive at the end of backward together with it, where the all-reduce
ends). Wall time counts everything: computing, sleeping, waiting on storage, blocking on a
device sync. CPU time is the second signal, the same sums of `thread_time`: it says whether the
lag was spent *busy* (a third of it or more CPU time: a slow chip, a noisy neighbour's CPU) or
*waiting* (storage, a device, a sleep), and it alone catches work spent inside the phase that
holds the collective (the others' wait hides it from the wall time there).

A rank is behind at a step when its lag at some phase exceeds every one of

    min_lag_s                          absolute floor: scheduling noise never fires
    (1 - threshold) x the step time    the others waited that share of the step for it
                                       (threshold 0.5: it doubled the step)
    Z x 1.4826 x MAD of the others     the spread of the other ranks' arrivals (many ranks)

and it is named (H202) when it was behind in `steps` steps in a row: from its first timed
steps on, whether it was always slow or became slow. It is reported once per episode and
re-armed after as many steps in a row in step with the others. Nothing is compared with a
rank's own past: a rank slow from the start is a straggler like any other.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainguard.findings import Finding

PHASES = ("data", "forward", "backward", "optimizer")
PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}
MAD_SIGMA = 1.4826  # MAD x this estimates the standard deviation of normal noise
Z = 4.0  # lags beyond this many robust standard deviations of the other ranks' arrivals
EXACT_RANKS = 16  # up to here the other ranks' median and MAD leave each rank out exactly


class PhaseTimer:
    """Per step, the wall and CPU seconds of each phase; kept until `take`."""

    def __init__(
        self,
        cpu_clock: Callable[[], float] = time.thread_time,
        wall_clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.cpu_clock, self.wall_clock = cpu_clock, wall_clock
        self.current: int | None = None
        self._cpu = self._wall = 0.0
        self.records: list[dict[str, Any]] = []
        self._clear_step()

    def _clear_step(self) -> None:
        self.wall = [0.0] * len(PHASES)
        self.cpu = [0.0] * len(PHASES)
        self.marked = False  # a phase was entered since the last end_step

    def _book(self) -> None:
        cpu, wall = self.cpu_clock(), self.wall_clock()
        if self.current is not None:
            self.cpu[self.current] += cpu - self._cpu
            self.wall[self.current] += wall - self._wall
        self._cpu, self._wall = cpu, wall

    def mark(self, phase: str) -> None:
        """The loop enters `phase`; phases outside PHASES (eval, checkpoint) pause the timer."""
        self._book()
        self.current = PHASE_INDEX.get(phase)
        self.marked = self.marked or self.current is not None

    def end_step(self, step: int, keep: bool = True) -> None:
        """Close the step's record (kept unless `keep` is false: a warm-up step). A second
        call for a step with no phase entered since records nothing."""
        self._book()
        self.current = None
        if self.marked and keep:
            self.records.append({"step": step, "wall": self.wall, "cpu": self.cpu})
        self._clear_step()

    def take(self) -> list[dict[str, Any]]:
        """The records since the last `take` (one per kept step, oldest first)."""
        out, self.records = self.records, []
        return out


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One rank's records summed per phase (the `rank_timings` event of `trainguard run`)."""
    return {
        "steps": len(records),
        "wall": {p: round(sum(r["wall"][i] for r in records), 6) for i, p in enumerate(PHASES)},
        "cpu": {p: round(sum(r["cpu"][i] for r in records), 6) for i, p in enumerate(PHASES)},
    }


@dataclass
class Lag:
    """How far one rank was behind the others at one step, where, and how it spent it."""

    phase: str
    seconds: float  # behind the median of the other ranks, at the end of `phase`
    busy_s: float  # of which CPU time of the training thread (vs the others' median)
    limit_s: float  # what it had to exceed
    step_s: float  # the step's wall time (median over the ranks)


def _others(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per rank and phase, the median and MAD of every other rank's value (`x`: ranks x
    phases; for many ranks, of all: a rank's own weight in them is then negligible)."""
    n = len(x)
    if n > EXACT_RANKS:
        med = np.median(x, axis=0)
        mad = np.median(np.abs(x - med), axis=0)
        return np.broadcast_to(med, x.shape), np.broadcast_to(mad, x.shape)
    rest = np.stack([np.delete(x, r, axis=0) for r in range(n)])  # ranks x others x phases
    med = np.median(rest, axis=1)
    return med, np.median(np.abs(rest - med[:, None, :]), axis=1)


def _lags(cumulative: np.ndarray, floor: float) -> dict[int, tuple[int, int, float, float]]:
    """The ranks with a lag over its limit: {rank: (the phase it fell behind in, the phase of
    its largest lag, that lag, its limit)}. `cumulative[r, p]`: rank r's seconds up to the end
    of phase p."""
    med, mad = _others(cumulative)
    lags = cumulative - med
    limits = np.maximum(floor, Z * MAD_SIGMA * mad)
    over = lags > limits
    out = {}
    for r in np.flatnonzero(over.any(axis=1)):
        worst = int(np.argmax(np.where(over[r], lags[r], -np.inf)))
        # The phase it fell behind in: where its lag grew most, up to the worst point.
        grew = np.diff(lags[r, : worst + 1], prepend=0.0)
        out[int(r)] = (int(np.argmax(grew)), worst, float(lags[r, worst]), float(limits[r, worst]))
    return out


def step_lags(
    walls: list[list[float]],
    cpus: list[list[float]],
    threshold: float = 0.5,
    min_lag_s: float = 0.01,
) -> list[Lag | None]:
    """Per rank, its lag at one step if it was behind, else None. `walls[r]` and `cpus[r]`:
    rank r's seconds per phase (PHASES order)."""
    arrive = np.cumsum(np.asarray(walls, dtype=float), axis=1)
    busy = np.cumsum(np.asarray(cpus, dtype=float), axis=1)
    step_s = float(np.median(arrive[:, -1]))
    floor = max(min_lag_s, (1.0 - threshold) * step_s)
    out: list[Lag | None] = [None] * len(walls)
    cpu_lags = _lags(busy, floor)
    for r, (phase, worst, seconds, limit) in _lags(arrive, floor).items():
        # Arrival first (wall time: what the others wait for, whatever the rank did); of the
        # lag, the CPU seconds say busy or waiting.
        busy_lag = busy[r, worst] - np.median(np.delete(busy[:, worst], r))
        out[r] = Lag(PHASES[phase], seconds, max(0.0, float(busy_lag)), limit, step_s)
    for r, (phase, _, seconds, limit) in cpu_lags.items():
        # CPU time alone when the wall time hides it: work inside the phase that holds the
        # collective, where the others' wait equals it and the wall times agree.
        lag = out[r]
        if lag is None or seconds > lag.seconds:
            out[r] = Lag(PHASES[phase], seconds, seconds, limit, step_s)
    return out


class StragglerMonitor:
    code = "H202"

    def __init__(self, threshold: float = 0.5, steps: int = 5, min_lag_s: float = 0.01) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError("threshold must be in (0, 1]")
        if steps < 1 or min_lag_s < 0:
            raise ValueError("steps must be >= 1 and min_lag_s >= 0")
        self.threshold, self.steps, self.min_lag_s = threshold, steps, min_lag_s
        self.behind: dict[int, list[Lag]] = {}  # the current run of steps behind, per rank
        self.in_step: dict[int, int] = {}  # steps in a row in step with the others, per rank
        self.flagged: set[int] = set()

    def update(
        self,
        records: list[list[dict[str, Any]]],
        hosts: list[str] | None = None,
    ) -> list[Finding]:
        """Score the steps every rank recorded (`records[r]`: rank r's `PhaseTimer.take()`),
        in order; H202 for each rank that becomes a straggler."""
        if len(records) < 2:
            return []
        by_step = [{int(x["step"]): x for x in rank} for rank in records]
        common = sorted(set.intersection(*(set(d) for d in by_step)))
        hosts = hosts or ["?"] * len(records)
        found: list[Finding] = []
        for step in common:
            rows = [d[step] for d in by_step]
            found += self.observe(step, [x["wall"] for x in rows], [x["cpu"] for x in rows], hosts)
        return found

    def observe(
        self,
        step: int,
        walls: list[list[float]],
        cpus: list[list[float]],
        hosts: list[str] | None = None,
    ) -> list[Finding]:
        """One step of every rank's phase seconds (index = rank)."""
        if len(walls) < 2:
            return []
        hosts = hosts or ["?"] * len(walls)
        found: list[Finding] = []
        for r, lag in enumerate(step_lags(walls, cpus, self.threshold, self.min_lag_s)):
            if lag is None:
                self.behind.pop(r, None)
                self.in_step[r] = self.in_step.get(r, 0) + 1
                if self.in_step[r] >= self.steps:
                    self.flagged.discard(r)  # recovered: a new episode is reported again
                continue
            self.in_step[r] = 0
            run = self.behind.setdefault(r, [])
            run.append(lag)
            del run[: -self.steps]
            if len(run) >= self.steps and r not in self.flagged:
                self.flagged.add(r)
                found.append(self._finding(step, r, run, hosts[r]))
        return found

    def _finding(self, step: int, r: int, run: list[Lag], host: str) -> Finding:
        phase = statistics.mode(x.phase for x in run)
        behind = statistics.median(x.seconds for x in run)
        busy = statistics.median(x.busy_s for x in run)
        step_s = statistics.median(x.step_s for x in run)
        # Busy when CPU time is a third of the lag or more: on a loaded host a computing rank
        # also waits for a core (a 30 ms burn took 64 ms at load average 10 here).
        kind = "busy" if busy >= behind / 3 else "waiting"
        score = max(0.0, 1.0 - behind / step_s) if step_s > 0 else 0.0
        why = (
            "it computes slower: a slow or throttled chip, a busy neighbour"
            if kind == "busy"
            else "it sleeps or waits: storage, the network, a device sync"
        )
        return Finding.of(
            "H202",
            f"rank {r} ({host}) is a straggler: in each of the last {len(run)} steps it "
            f"reached the end of its {phase} phase {behind * 1e3:.1f} ms after the median of "
            f"the other ranks, who waited for it; {kind}: {busy * 1e3:.1f} ms of the lag was "
            f"CPU time of its training thread ({why}). Step {step_s * 1e3:.1f} ms "
            f"(score {score:.2f}, threshold {self.threshold})",
            step=step,
            rank=r,
            where=host,
            data={
                "rank": r,
                "host": host,
                "phase": phase,
                "behind_s": round(behind, 6),
                "busy_s": round(busy, 6),
                "kind": kind,
                "step_s": round(step_s, 6),
                "score": round(score, 4),
                "steps": self.steps,
                "threshold": self.threshold,
                "min_lag_s": self.min_lag_s,
            },
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 2,
            "behind": {str(r): [vars(x) for x in run] for r, run in self.behind.items()},
            "in_step": {str(r): n for r, n in self.in_step.items()},
            "flagged": sorted(self.flagged),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; a state from before version 2 (own-history windows) starts afresh."""
        if state.get("version", 1) < 2:
            self.behind, self.in_step, self.flagged = {}, {}, set()
            return
        self.behind = {int(r): [Lag(**x) for x in run] for r, run in state["behind"].items()}
        self.in_step = {int(r): int(n) for r, n in state.get("in_step", {}).items()}
        self.flagged = {int(r) for r in state.get("flagged", [])}
