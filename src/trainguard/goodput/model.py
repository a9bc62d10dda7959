"""The goodput model in closed form: a run that saves every k steps, under exponential failures.

The timeline after a (re)start from a durable checkpoint (docs/goodput.md draws it):

    compute T | stall d | compute T (write in flight until w) | wait? | stall d | compute T ...

- T = k * step time: training between saves.
- d, the checkpoint stall: the time a save blocks training (a synchronous save's whole write;
  an asynchronous save's snapshot copy).
- w >= d, the write time: from the start of a save until the checkpoint is durable. The next
  save waits for the previous write, so one save starts every P = max(T + d, w).
- A failure (rate 1/M, M the job's mean time between failures) loses everything trained since
  the state of the newest durable checkpoint: a failure while a save is in flight (before w)
  falls back to the save before it. Then a restart of R seconds, which a failure during it
  starts again, resumes from that checkpoint and the timeline begins anew.

Every failure starts the same timeline again, so the long-run shares are expectations over one
cycle (failure-free stretch + restart: the renewal-reward theorem), which integrate in closed
form over the exponential density: exact for this model, for any failure rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The default failure model: Llama 3 405B's pre-training (Llama Team, "The Llama 3 Herd of
# Models", 2024, section 3.3.4): 419 unexpected interruptions in a 54-day snapshot on 16,384
# H100 GPUs. One GPU's mean time between interruptions, taking every interruption as one GPU's.
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54
LLAMA3_UNEXPECTED = 419
LLAMA3_GPU_MTBF_HOURS = LLAMA3_GPUS * LLAMA3_DAYS * 24 / LLAMA3_UNEXPECTED  # ~50,677 h
LLAMA3_SOURCE = (
    "Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 GPUs "
    f"(per-GPU MTBF = 16384 * 54 * 24 / 419 = {LLAMA3_GPU_MTBF_HOURS:,.0f} h)"
)

LOSSES = ("checkpoint_stall", "lost_work", "restart")
"""The causes of lost wall time: saves blocking training (waits for the previous write
included), training redone after a failure, restarts (failed restart attempts included)."""


@dataclass(frozen=True)
class Costs:
    """What one run pays, in seconds: per step, per save, per restart."""

    step_s: float
    stall_s: float
    write_s: float  # from the save's start until durable; equal to stall_s for a sync save
    restart_s: float


@dataclass(frozen=True)
class Expected:
    """Long-run shares of wall time for one interval: `ettr` trains, the rest is `losses`."""

    interval_steps: int
    ettr: float
    losses: dict[str, float]

    @property
    def dominant(self) -> str:
        return max(self.losses, key=lambda k: self.losses[k])


def job_mtbf_s(gpu_mtbf_hours: float, gpus: int) -> float:
    """The job fails when any of its GPUs does: independent failures add their rates."""
    return gpu_mtbf_hours * 3600.0 / gpus


def period_s(costs: Costs, interval_s: np.ndarray | float) -> np.ndarray:
    """Seconds from one save's start to the next: the next save waits for the write."""
    return np.maximum(np.asarray(interval_s, float) + costs.stall_s, costs.write_s)


def expected(costs: Costs, interval_steps: np.ndarray, mtbf_s: float) -> np.ndarray:
    """(ettr, stall, lost, restart) shares of wall time, shape (4, len(interval_steps))."""
    lam = 1.0 / mtbf_s
    T = np.asarray(interval_steps, float) * costs.step_s
    d, w, R = costs.stall_s, costs.write_s, costs.restart_s
    P = period_s(costs, T)
    # E[work kept per cycle] = T * sum over saves m of P(failure after save m is durable)
    #                        = T * exp(-lam (T + w)) / (1 - exp(-lam P)); wall per cycle
    # (failure-free stretch + restarts) = exp(lam R) / lam. expm1 keeps small rates exact.
    per_save = -np.expm1(-lam * P)
    ettr = lam * T * np.exp(-lam * (T + w + R)) / per_save
    # The stall (d from each save's start) and the wait (the write's overrun, P - T - d, at the
    # end of each cycle), weighted by the probability that no failure came before them.
    stall = (
        np.exp(-lam * T)
        / per_save
        * (-np.expm1(-lam * d) + np.exp(-lam * (d + T)) * -np.expm1(-lam * (P - d - T)))
        * np.exp(-lam * R)
    )
    restart = np.full_like(T, -math.expm1(-lam * R))
    lost = np.clip(1.0 - ettr - stall - restart, 0.0, None)  # the rest: work redone
    return np.stack([ettr, stall, lost, restart])


def expected_at(costs: Costs, interval_steps: int, mtbf_s: float) -> Expected:
    ettr, *losses = expected(costs, np.array([interval_steps]), mtbf_s)[:, 0]
    return Expected(
        int(interval_steps), float(ettr), {k: float(v) for k, v in zip(LOSSES, losses, strict=True)}
    )


def young_tau_s(stall_s: float, mtbf_s: float) -> float:
    """Young (1974): the first-order optimum time between checkpoints, sqrt(2 d M)."""
    return math.sqrt(2.0 * stall_s * mtbf_s)


def daly_tau_s(stall_s: float, mtbf_s: float) -> float:
    """Daly (2006), the higher-order optimum of the same trade-off (M when d >= 2M)."""
    if stall_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = stall_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * stall_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - stall_s


def to_steps(tau_s: float, step_s: float) -> int:
    """A time between saves as whole steps (at least one)."""
    return max(1, round(tau_s / step_s))


def best_interval(costs: Costs, mtbf_s: float, max_steps: int = 10**9) -> int:
    """The whole number of steps between saves that maximises the closed-form ETTR.

    ETTR rises then falls in k: a geometric grid up to a few MTBFs of training finds the peak,
    then every whole step around it is tried (20,001 evenly spaced ones past that many).
    """
    top = int(min(max_steps, max(2, 20 * mtbf_s / costs.step_s)))
    grid = np.unique(np.round(np.geomspace(1, top, 2000)).astype(np.int64))
    i = int(np.argmax(expected(costs, grid, mtbf_s)[0]))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    near = np.unique(np.round(np.linspace(lo, hi, min(hi - lo + 1, 20_001))).astype(np.int64))
    return int(near[np.argmax(expected(costs, near, mtbf_s)[0])])
