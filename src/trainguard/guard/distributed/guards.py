"""`DistributedGuards`: replica hashes (H201), stragglers (H202), hung ranks (R301) and dead
ranks (R302) for any torchrun loop. `Guard(..., distributed=True)` owns one; `trainguard run`
uses the same part.

Per step, in a data-parallel loop (every rank makes the same calls):

    with part.phase("forward", step): ...       # phase timings; a failed collective inside
    with part.phase("backward", step): ...      # becomes the hung-rank diagnosis
    optimizer.step()
    found = part.after_update(step, model, optimizer, checkpoint_due=...)   # H201 when due
    found += part.after_step(step)              # H202 every K steps; the monitored barrier

With one process every call is a no-op. Hung ranks: after `warmup_steps` steps the default
group's timeout becomes the collective timeout; a collective that fails (a rank did not come)
sends every surviving rank into a monitored barrier on the gloo monitor group that names the
ranks that did not arrive within the hang timeout; each survivor writes a hang report (its
stacks and the R301 finding) and exits with status 3 for the launcher to restart the job. A
rank stuck outside any collective is caught by the monitored barrier at every step boundary.
Both timeouts are derived from the step times (guard/derived_timeouts.py: max(floor, min(fixed
value, factor x p99))), with budgets of their own for the `checkpoint` and `eval` phases.

Dead ranks: a peer whose process ended (a gloo collective fails at once when its connection
closes) is named as dead (R302, guard/distributed/peers.py: the survivors look at their
same-host peers' pids) before any hang diagnosis, with its signal or exit status while the
kernel holds it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import torch

from trainguard.codes import get_code
from trainguard.config.distributed import DistributedConfig
from trainguard.findings import Finding
from trainguard.guard.decision import Decision
from trainguard.guard.detectors.straggler import PhaseTimer, StragglerMonitor, summary
from trainguard.guard.distributed.diagnosis import diagnose
from trainguard.guard.distributed.group import MonitorGroup
from trainguard.guard.distributed.group_timeouts import GroupTimeouts
from trainguard.guard.distributed.replica import (
    compare_replicas,
    merge_sets,
    no_replicas_finding,
    replica_digest,
    replica_sets,
)
from trainguard.guard.hang_report import SigtermStackDump

T = TypeVar("T")
STATE_VERSION = 1


class DistributedGuards:
    """The multi-process guards of one rank. Construct it on every rank after
    `init_process_group` (it creates the gloo monitor group, a collective)."""

    def __init__(
        self,
        config: DistributedConfig | None = None,
        *,
        run_dir: str | Path | None = None,
        max_rollbacks: int = 3,
        group: MonitorGroup | None = None,
        on_hang: Callable[[Finding], None] | None = None,
        agree_metrics: bool = True,
    ) -> None:
        self.config = config or DistributedConfig()
        # Hang reports go to the run dir; a loop without one gets them in the working directory.
        self.run_dir = Path(run_dir) if run_dir is not None else Path.cwd()
        self.max_rollbacks = max_rollbacks
        self.group = group if group is not None else MonitorGroup.create(self.config.sync_timeout_s)
        self.on_hang = on_hang
        self.agree_metrics = agree_metrics
        self.timer = PhaseTimer()
        self.stragglers = StragglerMonitor(
            self.config.straggler_threshold,
            self.config.straggler_steps,
            self.config.straggler_min_lag_s,
        )
        self.replica_rollbacks = 0
        self.steps_run = 0  # by this process: warm-up counts from the (re)start
        self.phase_name = "startup"
        self.last_timings: list[dict[str, Any]] | None = None  # per rank, summed per phase
        self._phases_marked = False
        self._told_no_replicas = False
        self._sigterm = SigtermStackDump(self.run_dir, self.rank) if self.active else None
        if self.active:
            # Load the code registry now: when a peer dies, the launcher stops the survivors
            # within a fraction of a second, too soon for the first import of every code module.
            get_code("R302")
        self.timeouts = GroupTimeouts(self.config)
        if self.active:
            self.timeouts.groups.append(self.group.group)

    @property
    def active(self) -> bool:
        return self.group is not None and self.group.size > 1

    @property
    def rank(self) -> int:
        return self.group.rank if self.group is not None else 0

    @property
    def warm(self) -> bool:
        return self.steps_run >= self.config.warmup_steps

    @property
    def replica_limit_reached(self) -> bool:
        """More replica rollbacks than `max_rollbacks`: the loop must halt."""
        return self.replica_rollbacks > self.max_rollbacks

    # -- start and stop ----------------------------------------------------------------------
    def start(self) -> None:
        """Arm the SIGTERM stack dump: when the launcher tears the job down after a failure,
        the ranks it stops (the hung one among them) write their stacks first."""
        if self._sigterm is not None:
            self._sigterm.arm()

    def connect(self) -> None:
        """Create the monitor group now if there was no initialised process group when this
        part was built (a framework that sets the group up itself, as Lightning does inside
        `fit`, after the user built the guard). A collective: every rank calls it. A no-op
        once connected, and with one process."""
        if self.group is not None:
            return
        self.group = MonitorGroup.create(self.config.sync_timeout_s)
        if self.active:
            self.timeouts.groups.append(self.group.group)
            self._sigterm = SigtermStackDump(self.run_dir, self.rank)
            self._sigterm.arm()

    def close(self) -> None:
        if self._sigterm is not None:
            self._sigterm.disarm()

    # -- phases --------------------------------------------------------------------------------
    def mark(self, phase: str) -> None:
        """The loop enters `phase` (data, forward, backward, optimizer; others pause the timer).
        `checkpoint` and `eval` run under their own collective timeout budget."""
        self.phase_name = phase
        if self.active:
            self._phases_marked = True
            self.timer.mark(phase)
            self.timeouts.enter(phase)

    # -- timeouts ------------------------------------------------------------------------------
    def collective_timeout_s(self) -> float:
        """The gradient group's timeout after warm-up (guard/distributed/group_timeouts.py)."""
        return self.timeouts.collective_s()

    def hang_timeout_s(self) -> float:
        """The monitored barriers' timeout (guard/distributed/group_timeouts.py)."""
        return self.timeouts.hang_s()

    @contextlib.contextmanager
    def budget(self, phase: str) -> Iterator[None]:
        """Run the block under `phase`'s collective timeout budget (checkpoint, eval) without
        marking a phase: a checkpoint load inside a rollback."""
        if not self.active:
            yield
            return
        with self.timeouts.budget(phase):
            yield

    @contextlib.contextmanager
    def phase(self, name: str, step: int) -> Iterator[None]:
        """Time `name` for the straggler check; a collective that fails inside (a timeout, a
        lost peer) becomes the hung-rank diagnosis."""
        self.mark(name)
        try:
            yield
        except torch.OutOfMemoryError:
            raise  # this rank's own failure, not a peer's: the others will name it
        except RuntimeError as e:  # gloo/nccl timeouts and lost peers are RuntimeErrors
            if not self.active:
                raise
            self.diagnose(step, e)

    def guarded(self, step: int, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)`, whose collectives may fail (timeout, dead peer): then a diagnosis."""
        if not self.active:
            return fn(*args)
        try:
            return fn(*args)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:
            self.diagnose(step, e)

    # -- per step ------------------------------------------------------------------------------
    def agree(self, step: int, values: dict[str, float | None]) -> dict[str, float | None]:
        """The metrics every rank's guard decides on: each value averaged over the ranks (a
        rank's local loss differs from the others'; a NaN anywhere stays NaN), so that no two
        ranks take different actions. A collective; a no-op with `agree_metrics=False` (a loop
        that reduces its metrics itself, like `trainguard run`)."""
        if not self.active or not self.agree_metrics:
            return values
        assert self.group is not None
        gathered = self.guarded(step, self.group.all_gather_object, values)
        out: dict[str, float | None] = {}
        for key in values:
            seen = [g.get(key) for g in gathered]
            out[key] = None if any(v is None for v in seen) else sum(seen) / len(seen)
        return out

    def after_update(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: Any = None,
        *,
        checkpoint_due: bool = False,
    ) -> list[Finding]:
        """After the update: the replica check every `replica_check_interval` steps and before
        every checkpoint (so that no corrupt state is saved). A collective. H201 counts one
        replica rollback; past `max_rollbacks`, `replica_limit_reached` is true."""
        if not self.active:
            return []
        self._end_timed_step(step)
        k = self.config.replica_check_interval
        if k == 0 or not (step % k == 0 or checkpoint_due):
            return []
        found = self.guarded(step, self.check_replicas, step, model, optimizer)
        if any(f.code == "H201" for f in found):
            self.replica_rollbacks += 1
        return found

    def check_replicas(
        self, step: int, model: torch.nn.Module, optimizer: Any = None
    ) -> list[Finding]:
        """Hash this rank's replica, gather every rank's hash and replica sets, compare each
        set. A collective: every rank calls it at the same step and gets the same findings."""
        assert self.group is not None
        include = optimizer if self.config.replica_check_optimizer else None
        mine = (replica_digest(model, include), replica_sets(model, self.group.size))
        gathered = self.group.all_gather_object(mine)
        digests = [str(d) for d, _ in gathered]
        sets = [s for s in merge_sets([s for _, s in gathered]) if len(s) > 1]
        if not sets:
            if self._told_no_replicas:
                return []
            self._told_no_replicas = True
            return [no_replicas_finding(step, self.group.size)]
        found: list[Finding] = []
        for ranks in sets:
            found += compare_replicas([digests[r] for r in ranks], self.group.hosts, step, ranks)
        return found

    def after_step(self, step: int) -> list[Finding]:
        """At the step boundary: warm-up, straggler scores every `straggler_interval` steps
        (the gathered timings are kept in `last_timings`, summed per rank), the monitored
        barrier."""
        self.last_timings = None
        if not self.active:
            return []
        self._end_timed_step(step)  # a loop that called no after_update (no model given)
        self.steps_run += 1
        if self.warm:  # warm-up steps (compiling, the first data) are no step times
            self.timeouts.step_boundary(time.monotonic())
        found: list[Finding] = []
        k = self.config.straggler_interval
        if k and step % k == 0:
            assert self.group is not None
            records = self.guarded(step, self.group.all_gather_object, self.timer.take())
            self.last_timings = [summary(r) for r in records]
            found = self.stragglers.update(records, self.group.hosts)
        if self.warm and self.config.step_barrier:
            self.barrier(step, self.hang_timeout_s())
        if not self._phases_marked:
            # A loop that marks no phases: the whole next step is timed as its forward phase.
            self.timer.mark("forward")
        return found

    def _end_timed_step(self, step: int) -> None:
        """Close the step's phase timings. Only steps that began after warm-up are kept: the
        ranks then begin each step together (the step barrier), so their arrivals compare;
        the warm-up steps' compiling and first data are no straggling."""
        self.timer.end_step(step, keep=self.steps_run >= self.config.warmup_steps)

    def end_step(
        self,
        step: int,
        model: torch.nn.Module | None,
        optimizer: Any = None,
        *,
        checkpoint_due: bool = False,
    ) -> Decision:
        """`after_update` and `after_step` as one decision: H201 asks for a rollback (no
        batches to skip: the data is not at fault), or a halt (R203) once the replica rollbacks
        exceed `max_rollbacks`; H202 is reported and the update stands."""
        found = (
            []
            if model is None
            else self.after_update(step, model, optimizer, checkpoint_due=checkpoint_due)
        )
        found += self.after_step(step)
        d = Decision(step, "apply", found)
        if not any(f.code == "H201" for f in found):
            return d
        if not self.replica_limit_reached:
            d.action = "rollback"
            return d
        d.action = "halt"
        d.findings.append(
            Finding.of(
                "R203",
                f"replicas diverged {self.replica_rollbacks} times "
                f"(max_rollbacks={self.max_rollbacks}): the same fault keeps coming back",
                step=step,
                data={"replica_rollbacks": self.replica_rollbacks},
            )
        )
        return d

    def sync(self, step: int) -> None:
        """Wait for every rank with the long timeout (after a checkpoint save or evaluation)."""
        if self.active:
            self.phase_name = "sync"
            self.barrier(step, self.config.sync_timeout_s)

    def barrier(self, step: int, timeout_s: float) -> None:
        assert self.group is not None
        try:
            self.group.barrier(timeout_s)
        except RuntimeError as e:
            self.diagnose(step, e, barrier_error=e)

    # -- the hung-rank diagnosis (diagnosis.py) ------------------------------------------------
    def diagnose(
        self, step: int, cause: BaseException, barrier_error: BaseException | None = None
    ) -> NoReturn:
        """Name the dead ranks (R302) or the ranks that did not arrive (R301), dump this
        process's stacks, exit for a restart (`diagnosis.diagnose`)."""
        diagnose(self, step, cause, barrier_error)

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The straggler windows and the replica rollback count (same on every rank), and the
        step times the timeouts are derived from (the saving rank's)."""
        return {
            "version": STATE_VERSION,
            "stragglers": self.stragglers.state_dict(),
            "replica_rollbacks": self.replica_rollbacks,
            "step_times": self.timeouts.state_dict(self._world_size()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stragglers.load_state_dict(state.get("stragglers", {}))
        self.replica_rollbacks = int(state.get("replica_rollbacks", 0))
        self.timeouts.load_state_dict(state.get("step_times"), self._world_size())

    def _world_size(self) -> int:
        return self.group.size if self.group is not None else 1
