"""Is a peer rank's process still there? Dead is not hung (R302 against R301).

Every rank's (host, pid, start time, pid namespace) is gathered when the monitor group is made.
A rank whose collective fails looks in /proc at the peers that share its host and its pid
namespace (containers with the host's network share its name, not its pids): a pid that is
gone, a zombie, or a pid now held by another process (another start time) is a dead rank. A
zombie (killed, not yet reaped by its launcher) still holds its exit status in /proc/PID/stat
(field 52, Linux 3.5+): the signal or status is then named too. Peers on other hosts cannot be
seen from here (their own launcher names them).
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass

from trainguard.util.processes import stat_fields


@dataclass(frozen=True)
class Peer:
    """One rank's process: its host, pid and start time (clock ticks since boot; None where
    there is no /proc)."""

    host: str
    pid: int
    start: str | None = None
    space: str | None = None  # boot id and pid namespace: where `pid` means this process


def pid_space() -> str | None:
    """This process's boot id and pid namespace, or None where /proc does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def this_process() -> Peer:
    """This process, as its peers will look for it."""
    pid = os.getpid()
    return Peer(socket.gethostname(), pid, process_start(pid), pid_space())


@dataclass(frozen=True)
class Death:
    """How a process ended, where known: the signal that killed it, or its exit status."""

    signal: int | None = None
    status: int | None = None

    @classmethod
    def from_wait_status(cls, raw: int | None) -> Death:
        if raw is None:
            return cls()
        if os.WIFSIGNALED(raw):
            return cls(signal=os.WTERMSIG(raw))
        if os.WIFEXITED(raw):
            return cls(status=os.WEXITSTATUS(raw))
        return cls()

    @classmethod
    def from_exitcode(cls, code: int) -> Death:
        """From a Popen/multiprocessing style code: negative is the signal that killed it."""
        return cls(signal=-code) if code < 0 else cls(status=code)

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = "signal"
            return f"killed by {name} (signal {self.signal})"
        if self.status is not None:
            return f"exited with status {self.status}"
        return "its process is gone (exit status unknown)"


def process_start(pid: int) -> str | None:
    """The process's start time (field 22), to tell it from a later process given the same pid."""
    fields = stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else None


def peer_death(peer: Peer) -> Death | None:
    """How `peer` (on this host) ended, or None while it runs."""
    fields = stat_fields(peer.pid)
    if fields is None:
        if os.path.isdir("/proc/self"):
            return Death()  # no such process any more
        try:
            os.kill(peer.pid, 0)  # no /proc (macOS): only "is there such a pid"
        except ProcessLookupError:
            return Death()
        except PermissionError:
            return None
        return None
    if peer.start is not None and len(fields) > 19 and fields[19] != peer.start:
        return Death()  # the pid was reused: ours is gone
    if fields[0] in ("Z", "X"):  # exited, not yet reaped: the status is still there
        raw = int(fields[49]) if len(fields) > 49 and fields[49].isdigit() else None
        return Death.from_wait_status(raw)
    return None


def dead_peers(peers: list[Peer], me: int) -> dict[int, Death]:
    """The ranks among `peers` on this host and in this pid namespace (other than `me`) whose
    process has ended."""
    here = Peer(socket.gethostname(), 0, None, pid_space())
    out: dict[int, Death] = {}
    for rank, peer in enumerate(peers):
        if rank == me or (peer.host, peer.space) != (here.host, here.space):
            continue
        death = peer_death(peer)
        if death is not None:
            out[rank] = death
    return out
