"""The ranks of one doctor job and how they meet without ever waiting forever.

Collectives cannot be the meeting point: a rank that never arrives blocks them all, and after a
timeout nothing more can be gathered. The ranks therefore meet through the process group's
key-value store (the TCPStore that torchrun or `init_process_group` set up): each rank writes
its keys, and waiting is polling for keys with a deadline. A rank whose key is missing at the
deadline is named; everyone else's reports still arrive. Rank 0 decides at each barrier who is
missing and every rank reads that decision, so all ranks skip (or run) the collectives together.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from trainguard.doctor.report import Who

_ROOT = "trainguard-doctor"


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index or 0} ({torch.cuda.get_device_name(device)})"
    return device.type


@dataclass
class Team:
    """This process's place among the ranks, and the store they meet in (None: one process)."""

    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "none"
    hosts: list[str] = field(default_factory=lambda: ["localhost"])
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    store: Any = None
    session: str = ""
    poll_s: float = 0.02

    @property
    def active(self) -> bool:
        return self.size > 1

    def who(self, rank: int | None = None) -> Who:
        r = self.rank if rank is None else rank
        return Who(r, self.hosts[r], self.devices[r])

    @classmethod
    def single(cls, device: torch.device | None = None) -> Team:
        import socket

        if device is None:
            device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        return cls(device=device, hosts=[socket.gethostname()], devices=[device_label(device)])

    @classmethod
    def from_dist(cls, dist: Any) -> Team:
        """The team of a joined job (`trainguard.train.world.Dist`: its rank, size,
        hosts, device, backend and gloo monitor group); one process when it is not active."""
        if not dist.active:
            return cls.single(dist.device)
        label = device_label(dist.device)
        # All ranks are present here (they just joined), so one gather is safe.
        gathered = dist.all_gather_object((label, uuid.uuid4().hex[:12]))
        from torch.distributed.distributed_c10d import _get_default_store

        return cls(
            rank=dist.world.rank,
            size=dist.world.size,
            device=dist.device,
            backend=dist.backend,
            hosts=list(dist.hosts),
            devices=[g[0] for g in gathered],
            store=_get_default_store(),
            session=gathered[0][1],
        )

    # -- the store -------------------------------------------------------------------------------
    def _key(self, name: str, rank: int | str) -> str:
        return f"{_ROOT}/{self.session}/{name}/{rank}"

    def publish(self, name: str, obj: Any, rank: int | str | None = None) -> None:
        self.store.set(self._key(name, self.rank if rank is None else rank), json.dumps(obj))

    def wait_for(self, name: str, ranks: list[int], timeout_s: float) -> list[int]:
        """Wait until every rank in `ranks` has published `name`; the ranks still missing at
        the deadline."""
        keys = [self._key(name, r) for r in ranks]
        deadline = time.monotonic() + timeout_s
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                return [r for r, k in zip(ranks, keys, strict=True) if not self.store.check([k])]
            time.sleep(self.poll_s)
        return []

    def collect(
        self, name: str, ranks: list[int], timeout_s: float
    ) -> tuple[dict[int, Any], list[int]]:
        """Every rank's `name` object that arrived within the deadline, and the missing ranks."""
        missing = self.wait_for(name, ranks, timeout_s)
        got = {r: json.loads(self.store.get(self._key(name, r))) for r in ranks if r not in missing}
        return got, missing

    def barrier(self, name: str, timeout_s: float) -> list[int]:
        """Meet the other ranks; the ranks that did not arrive within `timeout_s` (rank 0
        decides; the others read its decision, and name rank 0 if it does not come)."""
        self.publish(f"{name}/arrive", 1)
        if self.rank == 0:
            missing = self.wait_for(f"{name}/arrive", list(range(self.size)), timeout_s)
            self.publish(f"{name}/decision", missing, rank="all")
            return missing
        decision = self.receive(f"{name}/decision", timeout_s * 2 + 10)
        return [0] if decision is None else list(decision)

    def receive(self, name: str, timeout_s: float) -> Any | None:
        """Rank 0's announcement `name`, or None if it did not come within `timeout_s`."""
        key = self._key(name, "all")
        deadline = time.monotonic() + timeout_s
        while not self.store.check([key]):
            if time.monotonic() > deadline:
                return None
            time.sleep(self.poll_s)
        return json.loads(self.store.get(key))
