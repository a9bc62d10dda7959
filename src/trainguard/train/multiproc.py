"""The multi-process guards inside `trainguard run`: replica checks (H201), stragglers (H202),
hung ranks (R301), and the barriers that keep ranks in step around checkpoints.

`RunSession` calls, per step: `timed(phase)` at phase boundaries (via the trainer's on_phase),
`guarded(fn)` around the forward/backward (collective failures become a diagnosis),
`check_update(step, checkpoint_due)` after the update, `after_step(step)` at the step boundary,
and `sync()` after evaluations and checkpoint saves. With one process every call is a no-op.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import trainguard.codes.distributed  # noqa: F401  (registers R301)
from trainguard.errors import RunHalted
from trainguard.findings import Finding
from trainguard.monitors.straggler import PhaseTimer, StragglerMonitor
from trainguard.monitors.watchdog import EXIT_HANG
from trainguard.train.replica import check_replicas

if TYPE_CHECKING:
    from trainguard.train.run import RunSession

T = TypeVar("T")
# gloo: "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 2000 ms"
_MISSING = re.compile(r"Ranks? ([\d,\s]+?) failed to pass monitoredBarrier")


def missing_ranks(message: str) -> list[int]:
    """The ranks a failed monitored barrier named (rank 0's view); [] if it named none."""
    m = _MISSING.search(message)
    return sorted({int(x) for x in re.findall(r"\d+", m.group(1))}) if m else []


def dump_stacks(path: os.PathLike[str] | str, header: str) -> None:
    """Every thread's Python stack (as the hang watchdog writes them) into `path`."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(header + "\n\n")
        for ident, frame in frames.items():
            fh.write(f"--- thread {names.get(ident, '?')} ({ident}) ---\n")
            fh.write("".join(traceback.format_stack(frame)) + "\n")
        fh.write("--- faulthandler (all threads) ---\n")
        fh.flush()
        faulthandler.dump_traceback(file=fh, all_threads=True)
        fh.flush()
        os.fsync(fh.fileno())


class MultiProcessGuards:
    def __init__(self, session: RunSession) -> None:
        self.session = session
        self.dist = session.dist
        self.config = self.dist.config
        self.timer = PhaseTimer()
        self.stragglers = StragglerMonitor(
            self.config.straggler_threshold, self.config.straggler_history
        )
        self.steps_run = 0  # by this process: warm-up counts from the (re)start
        self.replica_rollbacks = 0
        self.phase = "startup"
        self._sigterm_file: Any = None

    def arm_sigterm_dump(self) -> None:
        """When the launcher tears the job down after a failure it sends SIGTERM to the other
        ranks, the hung one among them: dump their stacks then (faulthandler writes from a C
        signal handler, so a rank stuck inside a collective still writes), then terminate."""
        if not self.dist.active or self._sigterm_file is not None:
            return
        rank = self.dist.world.rank
        for old in self.session.run_dir.glob(f"stacks-rank{rank}-*.txt"):
            with contextlib.suppress(OSError):
                if old.stat().st_size == 0:  # armed by a killed run, never written
                    old.unlink()
        path = self.session.run_dir / f"stacks-rank{rank}-{os.getpid()}.txt"
        self._sigterm_file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (kept open)
        faulthandler.register(signal.SIGTERM, file=self._sigterm_file, all_threads=True, chain=True)

    def disarm_sigterm_dump(self) -> None:
        if self._sigterm_file is None:
            return
        faulthandler.unregister(signal.SIGTERM)
        path = Path(self._sigterm_file.name)
        self._sigterm_file.close()
        self._sigterm_file = None
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()

    @property
    def warm(self) -> bool:
        return self.steps_run >= self.config.warmup_steps

    def timed(self, phase: str) -> None:
        self.phase = phase
        if self.dist.active:
            self.timer.mark(phase)

    def guarded(self, step: int, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)`, whose collectives may fail (timeout, dead peer): then a diagnosis."""
        if not self.dist.active:
            return fn(*args)
        try:
            return fn(*args)
        except RuntimeError as e:  # gloo/nccl timeouts and lost peers are RuntimeErrors
            self.diagnose(step, e)

    # -- per step --------------------------------------------------------------------------------
    def check_update(self, step: int, checkpoint_due: bool) -> list[Finding]:
        """After the update: the injected replica fault, then the replica check when due
        (every K steps and before every checkpoint, so that no corrupt state is saved)."""
        s = self.session
        if s.faults.corrupt_replica(step, s.model):
            s.display.message(f"fault: flipped a bit in rank {self.dist.world.rank}'s weights")
        if self.dist.active:
            self.timer.end_step()
        k = self.config.replica_check_interval
        if not self.dist.active or k == 0 or not (step % k == 0 or checkpoint_due):
            return []
        found = self.guarded(step, check_replicas, self.dist, s.model, s.optimizer, step)
        if found:
            self.replica_rollbacks += 1
            if self.replica_rollbacks > s.recipe.guards.max_rollbacks:
                s.record(found)
                raise RunHalted(
                    f"replicas diverged {self.replica_rollbacks} times (H201); the last: "
                    f"{found[0].message}",
                    "drain the named hosts and restart; raise guards.max_rollbacks to retry more",
                )
        return found

    def after_step(self, step: int) -> list[Finding]:
        """At the step boundary: warm-up bookkeeping, straggler scores, the monitored barrier."""
        if not self.dist.active:
            return []
        self.steps_run += 1
        if self.steps_run == self.config.warmup_steps:
            self.dist.after_warmup()
        found: list[Finding] = []
        k = self.config.straggler_interval
        if k and step % k == 0:
            timing = self.timer.take()
            timings = self.guarded(step, self.dist.all_gather_object, timing)
            found = self.stragglers.update(step, timings, self.dist.hosts)
            self.session.log_event("rank_timings", timings=timings)
        if self.warm and self.config.step_barrier:
            self.barrier(step, self.config.hang_timeout_s)
        return found

    def sync(self, step: int) -> None:
        """Wait for rank 0's checkpoint write or everyone's evaluation, with the long timeout."""
        if self.dist.active:
            self.phase = "sync"
            self.barrier(step, self.config.sync_timeout_s)

    def barrier(self, step: int, timeout_s: float) -> None:
        try:
            self.dist.barrier(timeout_s)
        except RuntimeError as e:
            self.diagnose(step, e, barrier_error=e)

    # -- the hung-rank diagnosis -----------------------------------------------------------------
    def diagnose(
        self, step: int, cause: BaseException, barrier_error: BaseException | None = None
    ) -> NoReturn:
        """Name the ranks that did not arrive, dump this process's stacks, exit for a restart.

        If every rank does reach the diagnosis barrier, nobody hung: the failure was an
        ordinary error, and it is raised as such."""
        phase = self.phase
        if barrier_error is None:
            try:
                self.dist.barrier(self.config.hang_timeout_s, wait_all_ranks=True)
            except RuntimeError as e:
                barrier_error = e
            else:
                raise cause
        missing = missing_ranks(str(barrier_error))
        rank = self.dist.world.rank
        if missing:
            who = ", ".join(self.dist.where(r) for r in missing)
            message = f"{who} did not arrive within {self.config.hang_timeout_s:g}s"
        else:  # only rank 0 learns who is missing; others know that rank 0 did not answer
            first = str(barrier_error).splitlines()[0] if str(barrier_error) else ""
            message = f"the monitored barrier failed on {self.dist.where(rank)}: {first}"
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        txt = self.session.run_dir / f"hang-{stamp}-rank{rank}.txt"
        finding = Finding.of(
            "R301",
            f"hung rank at step {step} (phase {phase!r}): {message}; cause: "
            f"{str(cause).splitlines()[0][:300] if str(cause) else type(cause).__name__}",
            step=step,
            rank=missing[0] if len(missing) == 1 else None,
            where=", ".join(self.dist.hosts[r] for r in missing) or None,
            data={
                "missing_ranks": missing,
                "missing_hosts": [self.dist.hosts[r] for r in missing],
                "reporting_rank": rank,
                "phase": phase,
                "stack_file": txt.name,
                "exit_status": EXIT_HANG,
            },
        )
        dump_stacks(txt, f"trainguard R301 on rank {rank} (pid {os.getpid()}): {finding.message}")
        txt.with_suffix(".json").write_text(json.dumps(finding.to_dict(), indent=2) + "\n")
        self.session.record([finding])
        self.session.display.message(str(finding))
        if self.session.watchdog is not None:
            self.session.watchdog.stop()  # we exit for it; its backstop must not fire later
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_HANG)  # the launcher restarts the job; auto-resume takes it from there
