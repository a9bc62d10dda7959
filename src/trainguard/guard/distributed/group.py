"""The gloo "monitor" group: trainguard's own collectives, apart from the training's.

Monitored barriers (the only collective that names the ranks that did not arrive), the resume
step, replica hashes and straggler timings travel on a gloo group of every rank with its own long
timeout. It never waits on the GPU, and a short timeout on the gradient group (after warm-up)
does not cut it off.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

from trainguard.guard.distributed.peers import Peer, this_process


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


class MonitorGroup:
    """This process's rank among `size`, every rank's host, and the collectives on the group."""

    def __init__(
        self,
        group: Any,
        rank: int,
        size: int,
        hosts: list[str],
        timeout_s: float,
        processes: list[Peer] | None = None,
    ):
        self.group = group
        self.rank = rank
        self.size = size
        self.hosts = hosts
        self.timeout_s = timeout_s
        # Every rank's process (pid, start time): a survivor checks its peers on its own host.
        self.processes = processes or []

    @classmethod
    def create(cls, timeout_s: float) -> MonitorGroup | None:
        """A gloo group over every rank of the initialised default group (a collective: every
        rank calls it); None with one process or without torch.distributed."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        group = dist.new_group(backend="gloo", timeout=_td(timeout_s))
        rank, size = dist.get_rank(), dist.get_world_size()
        out: list[Any] = [None] * size
        me = this_process()
        dist.all_gather_object(out, (me.host, me.pid, me.start, me.space), group=group)
        peers = [Peer(str(h), int(pid), start, space) for h, pid, start, space in out]
        return cls(group, rank, size, [p.host for p in peers], timeout_s, peers)

    def where(self, rank: int) -> str:
        """'rank R (host)', for messages."""
        return f"rank {rank} ({self.hosts[rank] if 0 <= rank < len(self.hosts) else '?'})"

    def barrier(self, timeout_s: float | None = None, wait_all_ranks: bool = True) -> None:
        """A monitored barrier: raises naming the ranks that did not arrive within the timeout."""
        timeout = _td(timeout_s if timeout_s is not None else self.timeout_s)
        dist.monitored_barrier(self.group, timeout=timeout, wait_all_ranks=wait_all_ranks)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out


def shorten_default_timeout(seconds: float, group: Any = None) -> None:
    """Set the collective timeout of `group` (None: the default, gradient group): after warm-up
    a rank that does not arrive is noticed in `seconds` rather than after the backend's
    default 10-30 minutes (or the monitor group's `sync_timeout_s`)."""
    from torch.distributed.distributed_c10d import _set_pg_timeout  # no public equivalent

    _set_pg_timeout(_td(seconds), group)
