"""The soak of a user's command (`trainguard drill --chaos DURATION --command "..."`): the
command (torchrun and a loop built on the public parts: `Guard(run_dir=...)`, `Checkpointer`)
is launched as `RunLauncher` launches `trainguard run` (drills/chaos.py), and its faults come
from outside, since the loop has no injection hooks. The job's record (RUN_DIR/metrics.jsonl,
the step rows the loop's `Guard` writes) says when: a fault of step N lands once the record
holds step N - 1 (the job is computing step N).

- `kill`: SIGKILL of every process of the job (the launcher's group and every descendant:
  torchrun starts each worker in a session of its own);
- `corrupt`: the same kill once two checkpoints are committed, then a byte of the newest
  one's tensors flipped (`chaos.corrupt_newest`; the root is the record's `checkpoints.root`);
- `rank_kill`: SIGKILL of the rank-1 worker (the job's nearest process whose environment
  has RANK=1);
- `hung_rank`: SIGSTOP of rank 1; it is killed once another worker has ended (the survivors
  named it, R301), and whatever is left of the job when its launcher ends;
- `slow_rank`: rank 1 stopped and continued in a duty cycle from step N to the job's end.

`nan` and the one-process `hang` need a hook inside the loop: refused here (exit 2). Each
launch's findings are the rows the loop's guards appended to guard.jsonl (the run dir's and a
rank's own, RUN_DIR/*/guard.jsonl); the final model is the weights under the key "model" in
the newest checkpoint under the record's checkpoint root (`runner.weights_checksum`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.drills.chaos import corrupt_newest
from trainguard.drills.chaos_command import RUN_DIR
from trainguard.drills.chaos_plan import (
    checkpoint_root,
    committed_steps,
    plan_of,
    read_rows,
    step_rows,
)
from trainguard.drills.chaos_schedule import RANK_KINDS, Fault
from trainguard.drills.runner import weights_checksum
from trainguard.errors import BadInputError
from trainguard.faults import ENV_VAR as INJECT_ENV
from trainguard.util.processes import (
    child_env,
    descendants,
    process_environ,
    signal_process,
)

SENT = {  # each fault as it is sent from outside
    "kill": "SIGKILL of the job",
    "corrupt": "SIGKILL of the job (two checkpoints committed), a byte of the newest flipped",
    "rank_kill": "SIGKILL of rank 1",
    "hung_rank": "SIGSTOP of rank 1",
    "slow_rank": "rank 1 stopped 0.1 s of every 0.12 s",
}
POLL_S = 0.01  # the record is read when it grows; a toy step takes ~25 ms
SLOW_STOP_S, SLOW_RUN_S = 0.1, 0.02  # slow_rank: stopped 0.1 s of every 0.12 s


@dataclass
class CommandOutcome:
    """One launch of the command: its exit, the faults sent, the findings it logged."""

    returncode: int
    run_dir: Path
    delivered: list[Fault] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def final_step(self) -> int | None:
        """Completed steps by the record (its last step row + 1; None: no step row)."""
        rows = step_rows(self.run_dir)
        return max(r["step"] for r in rows) + 1 if rows else None

    def weights_checksum(self) -> str | None:
        root = checkpoint_root(self.run_dir)
        return None if root is None else weights_checksum(root)


class CommandLauncher:
    """`chaos.RunLauncher`'s interface for a user's command. One fault-free reference run for
    the whole soak (`workdir/reference`), run first: its record gives the run's length and
    checkpoint interval (`chaos_plan.plan_of`)."""

    def __init__(
        self,
        argv: list[str],
        workdir: Path,
        kinds: tuple[str, ...],
        say: Callable[[str], None] = lambda _: None,
        timeout_s: float = 3600.0,
    ) -> None:
        self.argv, self.workdir, self.kinds, self.say = argv, workdir, kinds, say
        self.timeout_s = timeout_s
        held = [n for n in ("reference", "round1") if self.run_dir(n).exists()]
        if held:
            raise BadInputError(
                f"--workdir {workdir} holds the runs of an earlier soak ({', '.join(held)}): "
                "the command would resume them, not start over",
                "give a new or empty --workdir (or none: a temporary folder)",
            )
        self._reference: CommandOutcome | None = None
        self._plan: tuple[int, int] | None = None

    def run_dir(self, name: str) -> Path:
        return self.workdir / name

    def describe(self, faults: list[Fault]) -> str:
        """What is sent to the job, and when (the JSON's `inject` for a command)."""
        return ", ".join(f"{SENT[f.kind]} once step {f.step - 1} is recorded" for f in faults)

    def command(self, run_dir: Path) -> list[str]:
        return [w.replace(RUN_DIR, str(run_dir)) for w in self.argv]

    def settings(self) -> list[str]:
        return [shlex.join(self.argv)]

    @property
    def steps(self) -> int:
        return self._plan_once()[0]

    @property
    def interval(self) -> int:
        return self._plan_once()[1]

    def _plan_once(self) -> tuple[int, int]:
        if self._plan is None:
            self.say("the fault-free reference run (the soak's length and checkpoint interval)")
            ref = self._reference = self.launch("reference", [])
            self._plan = plan_of(ref.run_dir, ref.returncode, self._log("reference"))
            if set(self.kinds) & set(RANK_KINDS):
                world = _world_size(ref.run_dir)
                if world is not None and world < 2:
                    raise BadInputError(
                        f"--fault-kind {', '.join(k for k in self.kinds if k in RANK_KINDS)} "
                        f"needs several processes, and the reference run had {world}",
                        "launch the command with torchrun --nproc-per-node 2 or more, or "
                        "choose kill or corrupt",
                    )
        return self._plan

    def reference(self, number: int, data: list[Fault], say: Callable[[str], None]) -> Any:
        self._plan_once()
        return self._reference

    def launch(self, name: str, faults: list[Fault]) -> CommandOutcome:
        run_dir = self.run_dir(name)
        self.workdir.mkdir(parents=True, exist_ok=True)  # its logs; the command makes run_dir
        before = _guard_rows(run_dir)
        job = Job(self.command(run_dir), run_dir, self._log(name))
        returncode = job.run(faults, self.timeout_s)
        found = [
            r for p, rows in _guard_rows(run_dir).items() for r in rows[len(before.get(p, [])) :]
        ]
        return CommandOutcome(returncode, run_dir, job.delivered, found)

    def fired(self, fault: Fault, out: CommandOutcome) -> bool:
        """Sent, and the job ended with an error: a dead worker's launcher exits 1 (torchrun),
        a survivor that named the hang or the death exits 3; any non-zero end counts."""
        return fault in out.delivered and out.returncode != 0

    def corrupt(self, name: str) -> str:
        root = checkpoint_root(self.run_dir(name))
        return "no checkpoint root in the record" if root is None else corrupt_newest(root)

    def _log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"


def _guard_rows(run_dir: Path) -> dict[Path, list[dict[str, Any]]]:
    """The rows of every guard.jsonl of the run (the run dir's, and a rank's own folder's)."""
    files = [run_dir / "guard.jsonl", *sorted(run_dir.glob("*/guard.jsonl"))]
    return {p: read_rows(p) for p in files}


def _world_size(run_dir: Path) -> int | None:
    from trainguard.metrics.record_read import read_run_info

    env = (read_run_info(run_dir) or {}).get("environment") or {}
    world = env.get("world_size")
    return world if isinstance(world, int) else None


class Job:
    """One launch: the command in a process group of its own, a driver thread per fault, and
    every process of it killed when its launcher ends (none outlives the launch)."""

    def __init__(self, argv: list[str], run_dir: Path, log: Path) -> None:
        self.argv, self.run_dir, self.log = argv, run_dir, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen: dict[int, str] = {}  # every process of the job seen: (pid, start time)
        self.delivered: list[Fault] = []
        self.done = threading.Event()
        self.started = 0.0

    def run(self, faults: list[Fault], timeout_s: float) -> int:
        self.started = time.time()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its group: what a kill of the job reaches
                # Named as the launcher of a trainguard process it starts (which then ends with
                # this one); no fault of a `trainguard run` of ours leaks into it.
                env=child_env({k: v for k, v in os.environ.items() if k != INJECT_ENV}),
            )
        threads = [threading.Thread(target=self._drive, args=(f,), daemon=True) for f in faults]
        for t in threads:
            t.start()
        try:
            returncode = self._wait_job(timeout_s)
        finally:
            self.done.set()
            for t in threads:
                t.join()
            self.kill_all()  # whatever is left: a stopped rank, a worker its launcher left
        return returncode

    def _wait_job(self, timeout_s: float) -> int:
        """The launcher's exit status; every process of the job is seen on the way (a worker
        its launcher leaves behind is no descendant any more once the launcher has ended)."""
        deadline = time.monotonic() + timeout_s
        assert self.proc is not None
        while (code := self.proc.poll()) is None:
            self.processes()
            if time.monotonic() > deadline:
                self.kill_all()
                return self.proc.wait()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.5)
        return code

    def processes(self) -> list[tuple[int, str]]:
        found = descendants(self.proc.pid) if self.proc else []
        self.seen.update(found)
        return found

    def rank(self, rank: int) -> tuple[int, str] | None:
        found = self.processes()
        return None if self.proc is None else rank_process(self.proc.pid, rank, found)

    def kill_all(self) -> None:
        self.processes()
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):  # its group: the processes not yet seen
                os.killpg(self.proc.pid, signal.SIGKILL)
        for pid, start in list(self.seen.items()):
            signal_process(pid, start, signal.SIGKILL)

    def _reached(self, step: int) -> bool:
        """This launch's record holds step `step` (rows of earlier launches are older)."""
        return any(r["step"] >= step for r in step_rows(self.run_dir, since=self.started))

    def _wait(self, ready: Callable[[], bool]) -> bool:
        size = -1
        while not self.done.is_set():
            now = _size(self.run_dir / "metrics.jsonl")
            if now != size:
                size = now
                if ready():
                    return True
            time.sleep(POLL_S)
        return False

    def _drive(self, fault: Fault) -> None:
        def ready() -> bool:
            if not self._reached(fault.step - 1):
                return False
            if fault.kind != "corrupt":
                return True
            # One to fall back to: a checkpoint still being written is not yet committed.
            root = checkpoint_root(self.run_dir)
            return root is not None and len(committed_steps(root)) >= 2

        if not self._wait(ready):
            return
        if fault.kind in ("kill", "corrupt"):
            self.kill_all()
            self.delivered.append(fault)
            return
        target = self._rank_one()
        if target is None:
            return
        sig = signal.SIGSTOP if fault.kind in ("hung_rank", "slow_rank") else signal.SIGKILL
        if signal_process(*target, sig):
            self.delivered.append(fault)
        if fault.kind == "hung_rank":
            self._reap_when_survivors_end(target)
        elif fault.kind == "slow_rank":
            self._throttle(target)

    def _rank_one(self) -> tuple[int, str] | None:
        while not self.done.is_set():
            if (found := self.rank(1)) is not None:
                return found
            time.sleep(POLL_S)
        return None

    def _reap_when_survivors_end(self, stopped: tuple[int, str]) -> None:
        """Once another worker has ended (it named the hung rank), the stopped one is killed:
        a launcher's SIGTERM would wait for a stopped process."""
        others = [p for rank, p in workers(self.processes()).items() if rank != "1"]
        while not self.done.is_set():
            if any(not signal_process(pid, start, 0) for pid, start in others):
                signal_process(*stopped, signal.SIGKILL)
                return
            time.sleep(0.05)

    def _throttle(self, target: tuple[int, str]) -> None:
        while not self.done.wait(SLOW_STOP_S):
            signal_process(*target, signal.SIGCONT)
            if self.done.wait(SLOW_RUN_S) or not signal_process(*target, signal.SIGSTOP):
                break
        signal_process(*target, signal.SIGCONT)


def rank_process(
    pid: int, rank: int, found: list[tuple[int, str]] | None = None
) -> tuple[int, str] | None:
    """(pid, start time) of the descendant of `pid` that is worker `rank` (RANK in the
    environment it started with), nearest to `pid` first: the worker, not a child of it
    (which inherits its RANK); None when there is none. `found`: `descendants(pid)`, read
    already."""
    for child, start in descendants(pid) if found is None else found:
        if _rank_of(child) == str(rank):
            return child, start
    return None


def workers(found: list[tuple[int, str]]) -> dict[str, tuple[int, str]]:
    """RANK -> the worker among `found` (`descendants`, nearest first): the nearest process
    with that RANK, not its children (data-loader workers, compilers), which inherit it."""
    out: dict[str, tuple[int, str]] = {}
    for proc in found:
        rank = _rank_of(proc[0])
        if rank is not None:
            out.setdefault(rank, proc)
    return out


def _rank_of(pid: int) -> str | None:
    return (process_environ(pid) or {}).get("RANK")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1
