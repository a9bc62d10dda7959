"""Local processes: how many this machine holds, and that none outlives what started it.

How many (`check_local_processes`): every command that starts local processes (`run --nproc`,
`doctor --nproc`, `check-precision --nproc`/`--collective`, `drill`) checks the count before it
starts anything: no more than the cores this process may use (`os.sched_getaffinity`, and a
cgroup v2 CPU quota), and `PROCESS_MEMORY` for each within the memory available (MemAvailable,
and a cgroup v2 limit). Above either it is bad input (exit 2) naming the count, the machine and
the fix, unless the user passed `--oversubscribe`: hundreds of ranks on two cores do not fail,
they crawl (load average 240, swapping) for as long as anyone lets them.

Lifetime (`launcher_env`, `child_env`, `die_with_launcher`): a process that starts workers names
itself to them in LAUNCHER_ENV as "PID:START" (START: the kernel's start time of the process, so
that a reused pid is never taken for it). Each worker calls `die_with_launcher()` first thing
(`python -m trainguard`, the console script, check-precision's gloo workers) and from then on is
SIGKILLed when its launcher ends in any way, a SIGKILL included:
- by the kernel at once, when the launcher is its parent (prctl PR_SET_PDEATHSIG);
- by a daemon thread that waits on a pidfd of the launcher (polls where there is none): it
  works at any depth (check-precision's workers are children of a fork server), and catches a
  launcher that ended before the prctl was set (then the worker ends at once).
A worker that leads its own process group (torch's elastic agent starts each one in a session
of its own) takes the group with it. A worker killed this way writes nothing more: a checkpoint
it was writing is a temporary folder that no commit (rename, manifest last) adopted. This is
what makes a run dir's lock, held by `run --nproc`'s launcher, cover the whole job: no worker
lives longer than the lock's holder.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trainguard.errors import BadInputError

LAUNCHER_ENV = "TRAINGUARD_LAUNCHER"
"""Set for the workers a trainguard command starts: "PID:START" of that command's process."""
PROCESS_MEMORY = 256 << 20
"""The least memory one local process takes: Python with torch and trainguard imported holds
about 235 MiB before any work (155 MiB of it its own), and a rank's work comes on top."""
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5

# (this process's pid, the launcher it watches): a forked child has no watcher thread.
_watched: tuple[int, str] | None = None


# --- how many ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    """What this process may use: CPU cores, and memory in bytes (None: unknown)."""

    cores: int
    memory: int | None

    @classmethod
    def here(cls) -> Machine:
        return cls(available_cores(), available_memory())

    def fits(self) -> int:
        """How many local processes fit: one a core, `PROCESS_MEMORY` each (at least one)."""
        by_memory = self.cores if self.memory is None else self.memory // PROCESS_MEMORY
        return max(1, min(self.cores, by_memory))

    def too_many(self, count: int) -> str | None:
        """Why `count` processes do not fit here; None when they do."""
        if count > self.cores:
            return f"but this process may use {self.cores} CPU core(s) (os.sched_getaffinity)"
        if self.memory is not None and count * PROCESS_MEMORY > self.memory:
            return (
                f"but they need at least {count * PROCESS_MEMORY / 2**30:.1f} GiB "
                f"({PROCESS_MEMORY >> 20} MiB each) and {self.memory / 2**30:.1f} GiB of memory "
                "is available"
            )
        return None


def check_local_processes(
    count: int,
    asked: str,
    fewer: Callable[[int], str],
    oversubscribe: bool = False,
    machine: Machine | None = None,
) -> None:
    """BadInputError (exit 2) unless `count` local processes fit this machine (`Machine.fits`)
    or `oversubscribe` says to start them anyway. `asked` names what the user asked for
    ("--nproc 8"); `fewer(n)` says how to ask for what fits when `n` processes do."""
    if oversubscribe:
        return
    machine = machine or Machine.here()
    why = machine.too_many(count)
    if why is None:
        return
    raise BadInputError(
        f"{asked} would start {count} local processes, {why}: they would share the machine "
        "and crawl. Nothing was started",
        f"{fewer(machine.fits())}; or pass --oversubscribe to start them anyway (slower, and "
        "timings mean less)",
    )


def available_cores() -> int:
    """The CPU cores this process may run on: its affinity, within a cgroup v2 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    return max(1, cores)


def available_memory() -> int | None:
    """Bytes of memory available to new processes (MemAvailable, within a cgroup v2 limit);
    None where the system does not say."""
    available = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            free = max(0, int(limit) - used)
            available = free if available is None else min(available, free)
    return available


# --- lifetime ------------------------------------------------------------------------------


def launcher_token(pid: int | None = None) -> str:
    """ "PID:START" of process `pid` (this one by default); START is empty without /proc."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid) or ''}"


@contextlib.contextmanager
def launcher_env() -> Iterator[str]:
    """Name this process in LAUNCHER_ENV for the workers started inside the block (they
    inherit the environment); the previous value is restored after it."""
    previous = os.environ.get(LAUNCHER_ENV)
    token = os.environ[LAUNCHER_ENV] = launcher_token()
    try:
        yield token
    finally:
        if previous is None:
            os.environ.pop(LAUNCHER_ENV, None)
        else:
            os.environ[LAUNCHER_ENV] = previous


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with this process named as the child's launcher."""
    return {**(os.environ if env is None else env), LAUNCHER_ENV: launcher_token()}


def die_with_launcher(token: str | None = None) -> None:
    """In a worker: be SIGKILLed when the launcher `token` names ends (default: LAUNCHER_ENV;
    nothing without one). Ends this process at once when the launcher has ended already."""
    global _watched
    if token is None:
        # Taken out of the environment: this worker's own children (a user's subprocess, a
        # `trainguard report` from a hook) are not workers, and must not die with the launcher
        # or, once it has ended, kill themselves at start. A launcher names its own workers.
        token = os.environ.pop(LAUNCHER_ENV, "")
    pid_text, _, start = token.partition(":")
    if not pid_text.isdigit() or _watched == (os.getpid(), token):
        return
    pid = int(pid_text)
    if pid == os.getpid():  # the launcher itself (a command run inside the launching process)
        return
    if os.getppid() == pid:
        _parent_death_signal(signal.SIGKILL)
    # After the prctl: a launcher that ended before it is seen here (the start-up race).
    if not _alive(pid, start):
        _die()
    _watched = (os.getpid(), token)
    threading.Thread(
        target=_watch, args=(pid, start), name="trainguard-launcher-watch", daemon=True
    ).start()


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (field 3, the state, on: index i is
    field i + 3), or None when it cannot be read (no such process, or no /proc). The name is
    cut at its last ")": a command name may hold spaces and parentheses."""
    try:
        text = Path(f"/proc/{pid}/stat").read_bytes().decode("ascii", "replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (ticks since boot); None when it has ended (a zombie
    included) or there is no /proc."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]  # field 22: starttime


def process_started_at(pid: int | None = None) -> float | None:
    """When process `pid` (this one by default) started, in seconds since the epoch (the
    clock of `time.time()`); None without /proc or when it has ended. Its age is read from the
    kernel's uptime clock, so the answer is good to its tick (10 ms), whatever the boot time."""
    start = _start_time(os.getpid() if pid is None else pid)
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if start is None or not start.isdigit():
        return None
    return time.time() - max(0.0, uptime - int(start) / ticks)


def pid_alive(pid: int) -> bool:
    """True while a process `pid` exists on this machine (one of another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- a job's processes (`drill --chaos --command` signals them from outside) ---------------


def descendants(pid: int) -> list[tuple[int, str]]:
    """The living descendants of process `pid`, nearest first, as (pid, start time) pairs read
    from /proc's parent links ([] without /proc). The start time names the process beyond its
    pid, which may be reused once it ends: `signal_process` checks it before each signal. A
    launcher's workers are found whatever their session (torchrun starts each in its own)."""
    parents: dict[int, tuple[int, str]] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            fields = stat_fields(int(entry.name)) if entry.name.isdigit() else None
            if fields and len(fields) > 19 and fields[0] not in ("Z", "X"):
                parents[int(entry.name)] = (int(fields[1]), fields[19])
    found: list[tuple[int, str]] = []
    frontier = {pid}
    while frontier:
        level = [(p, start) for p, (ppid, start) in parents.items() if ppid in frontier]
        found += sorted(level)
        frontier = {p for p, _ in level}
    return found


def process_environ(pid: int) -> dict[str, str] | None:
    """The environment process `pid` started with (/proc/PID/environ); None when it cannot be
    read (ended, another user's, no /proc)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, _, v in pairs}


def signal_process(pid: int, start: str, sig: int) -> bool:
    """Send `sig` to `pid` if it is still the process that started at `start` (a reused pid is
    left alone); True when it was sent."""
    if not _alive(pid, start):
        return False
    try:
        os.kill(pid, sig)
    except OSError:  # ended in between, or not ours
        return False
    return True


def _alive(pid: int, start: str) -> bool:
    if start:
        return _start_time(pid) == start
    return pid_alive(pid)  # no start time recorded (no /proc): the pid is all there is


def _parent_death_signal(sig: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def _watch(pid: int, start: str) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (kernel < 5.3, not Linux): poll
        while _alive(pid, start):
            time.sleep(_POLL_S)
    else:
        # Checked after the open: the pidfd then refers to the launcher, not to a reused pid.
        if _alive(pid, start):
            poller = select.poll()  # select() refuses descriptors from 1024 up
            poller.register(fd, select.POLLIN)
            poller.poll()  # readable once the process has ended
    _die()


def _die() -> None:
    # No farewell on stderr: it may be a full pipe nobody reads any more, and a write there
    # would block the one thing that matters now.
    with contextlib.suppress(OSError):
        if os.getpgrp() == os.getpid():  # our own group: our children go too
            os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
