"""A Monte Carlo simulation of the goodput model's timeline, to check the closed form.

Each cycle starts at a resume from a durable checkpoint. Its failure time is drawn (exponential,
mean the job MTBF); the events before it are laid out on the timeline: the first T of training,
then a save every P = max(T + stall, write), each blocking for the stall and durable `write`
seconds after it starts, each waiting for the previous write. What was trained after the state
of the newest durable save is lost; the time in stalls and waits is the stall; the restart is
drawn attempt by attempt (a failure during a restart starts it again). The long-run shares are
the sums over many cycles (the renewal-reward estimator), with a 95% confidence interval by the
delta method for a ratio of sums.

Every interval is simulated on the same draws (common random numbers), so that intervals are
compared on the same luck; a seeded numpy generator makes the result a function of the seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainguard.goodput.model import LOSSES, Costs, period_s

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Draws:
    """Per cycle: the failure-free time after the resume, and the time spent restarting."""

    up_s: np.ndarray
    restart_s: np.ndarray


@dataclass(frozen=True)
class Simulated:
    interval_steps: int
    ettr: float
    ci95: tuple[float, float]
    losses: dict[str, float]
    cycles: int

    def to_dict(self, losses: bool = True) -> dict:
        out = {"interval_steps": self.interval_steps, "ettr": self.ettr, "ci95": list(self.ci95)}
        return {**out, "losses": self.losses, "cycles": self.cycles} if losses else out


def draw(costs: Costs, mtbf_s: float, cycles: int, seed: int) -> Draws:
    """`cycles` failures and the restarts after them, from `seed`: about exp(R / M) restart
    attempts per failure (the plan refuses a restart of several MTBFs before drawing)."""
    rng = np.random.default_rng(seed)
    up = rng.exponential(mtbf_s, size=cycles)
    restart = np.zeros(cycles)
    pending = np.arange(cycles)
    while pending.size:  # each pass: one restart attempt of every cycle still restarting
        until = rng.exponential(mtbf_s, size=pending.size)
        failed = until < costs.restart_s
        restart[pending] += np.where(failed, until, costs.restart_s)
        pending = pending[failed]
    return Draws(up, restart)


def cycle_times(costs: Costs, interval_steps: int, up_s: np.ndarray) -> tuple[np.ndarray, ...]:
    """(kept, stall, lost) seconds of each cycle whose failure comes `up_s` after the resume."""
    T = interval_steps * costs.step_s
    d, w = costs.stall_s, costs.write_s
    P = float(period_s(costs, T))
    t = up_s
    started = t >= T  # the first save has started
    # j: saves started by the failure; u: time since the newest one started.
    j = np.where(started, np.floor((t - T) / P) + 1, 0)
    u = np.where(started, t - T - (j - 1) * P, 0.0)
    durable = np.where(started & (u >= w), j, np.maximum(j - 1, 0))
    trained = np.where(started, T * j + np.clip(u - d, 0.0, T), t)
    stall = np.where(
        started,
        (j - 1) * (P - T) + np.minimum(u, d) + np.maximum(u - d - T, 0.0),
        0.0,
    )
    kept = T * durable
    return kept, stall, trained - kept


def simulate(costs: Costs, interval_steps: int, draws: Draws) -> Simulated:
    kept, stall, lost = cycle_times(costs, interval_steps, draws.up_s)
    wall = draws.up_s + draws.restart_s
    total = wall.sum()
    ettr = kept.sum() / total
    n = wall.size
    # The ratio estimator's standard error: residuals kept - ettr * wall (the delta method).
    resid = kept - ettr * wall
    se = math.sqrt(float((resid**2).sum()) / max(n * (n - 1), 1)) / (total / n)
    shares = (stall.sum() / total, lost.sum() / total, draws.restart_s.sum() / total)
    return Simulated(
        interval_steps=int(interval_steps),
        ettr=float(ettr),
        ci95=(float(ettr - Z95 * se), float(ettr + Z95 * se)),
        losses={k: float(v) for k, v in zip(LOSSES, shares, strict=True)},
        cycles=n,
    )


def sweep(costs: Costs, intervals: list[int], draws: Draws) -> list[Simulated]:
    """Every interval on the same draws."""
    return [simulate(costs, k, draws) for k in intervals]
