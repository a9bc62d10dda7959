"""The multi-process timeouts of one rank: the gradient group's collective timeout and the
monitored barriers' hang timeout, derived from the run's own step times (guard/derived_timeouts.py),
with the start-up, checkpoint and eval budgets apart.

    collective = max(timeout_floor_s, min(collective_timeout_s, timeout_factor x p99))
    hang       = max(timeout_floor_s, min(hang_timeout_s,       timeout_factor x p99))

over the last 128 step times after warm-up (fixed values until 5 were seen, or with
`derive_timeouts: false`). Until warm-up ends the default group keeps `init_timeout_s` (the
start-up budget); while the loop is in its `checkpoint` or `eval` phase it has
`checkpoint_timeout_s` / `eval_timeout_s`, and such a step is no step time.

The step times travel with the checkpoint (`state_dict`): a process that resumes on as many
processes as the one that saved takes them, so its timeouts are derived from its first warm
step on, not after 5 more steps under the fixed ones (300 s + 60 s: a rank hung early in a
resumed job would take six minutes to name). On another process count the steps run at
another pace: it times its own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from trainguard.config.distributed import DistributedConfig
from trainguard.guard.derived_timeouts import StepTimes, derived_timeout
from trainguard.guard.distributed.group import shorten_default_timeout

BUDGET_PHASES = ("checkpoint", "eval")  # phases with a timeout of their own, not a step time


class GroupTimeouts:
    """The timeouts, and the default group's, as the loop's steps and phases go by."""

    def __init__(self, config: DistributedConfig) -> None:
        self.config = config
        self.step_times = StepTimes()
        self.applied_s: float | None = None  # the default group's step timeout, once warm
        self.budget_phase: str | None = None  # the budget phase the loop is in
        # The groups whose timeout follows the step: the default (gradient) group, and the
        # guard's own monitor group once made (its per-step all-gathers: a rank stopped between
        # the gradient all-reduce and the guard's agreement would wait `sync_timeout_s`).
        self.groups: list[Any] = [None]

    def _derived(self, ceiling_s: float) -> float | None:
        c = self.config
        if not c.derive_timeouts:
            return None
        return derived_timeout(
            self.step_times.durations,
            factor=c.timeout_factor,
            q=c.timeout_percentile,
            floor_s=c.timeout_floor_s,
            ceiling_s=ceiling_s,
        )

    def collective_s(self) -> float:
        """The gradient group's timeout after warm-up: derived (ceiling `collective_timeout_s`)
        once enough steps were timed, else `collective_timeout_s`."""
        fixed = self.config.collective_timeout_s
        derived = self._derived(fixed)
        return fixed if derived is None else derived

    def hang_s(self) -> float:
        """The monitored barriers' timeout: derived like the collective one (ceiling
        `hang_timeout_s`), else `hang_timeout_s`."""
        fixed = self.config.hang_timeout_s
        derived = self._derived(fixed)
        return fixed if derived is None else derived

    def budget_s(self, phase: str) -> float:
        c = self.config
        return c.checkpoint_timeout_s if phase == "checkpoint" else c.eval_timeout_s

    def enter(self, phase: str | None) -> None:
        """The loop is now in budget phase `phase` (None: none). The default group gets the
        budget's timeout, and the step timeout back after it; before warm-up the start-up
        timeout (`init_timeout_s`) stands."""
        budget = phase if phase in BUDGET_PHASES else None
        if budget == self.budget_phase:
            return
        self.budget_phase = budget
        if budget is not None:
            self.step_times.skip_this_step()
        if self.applied_s is None:
            return  # still warming up
        self._apply(self.budget_s(budget) if budget is not None else self.applied_s)

    @contextlib.contextmanager
    def budget(self, phase: str) -> Iterator[None]:
        """The block runs under `phase`'s budget (a checkpoint load inside a rollback)."""
        prev = self.budget_phase
        self.enter(phase)
        try:
            yield
        finally:
            self.enter(prev)

    def _apply(self, seconds: float) -> None:
        for group in self.groups:
            shorten_default_timeout(seconds, group)

    def state_dict(self, world_size: int) -> dict[str, Any]:
        return {"world_size": world_size, "durations": list(self.step_times.durations)}

    def load_state_dict(self, state: Any, world_size: int) -> None:
        """Take the step times of the process that saved `state` when it ran on `world_size`
        processes too. A checkpoint is data: anything but a list of positive finite seconds
        is left out."""
        if not isinstance(state, dict) or state.get("world_size") != world_size:
            return
        durations = state.get("durations")
        if not isinstance(durations, list):
            return
        seconds = [
            float(d)
            for d in durations
            if isinstance(d, int | float) and not isinstance(d, bool) and 0 < d < math.inf
        ]
        self.step_times.durations.extend(seconds[-(self.step_times.durations.maxlen or 0) :])

    def step_boundary(self, now: float) -> None:
        """A warm step ended at `now` (monotonic): time it, and give the default group the
        current collective timeout when it moved by more than 10% (each change is a call into
        the backend)."""
        self.step_times.boundary(now)
        t = self.collective_s()
        old = self.applied_s
        if old is None or abs(t - old) > 0.1 * old:
            self.applied_s = t
            if self.budget_phase is None:
                self._apply(t)
