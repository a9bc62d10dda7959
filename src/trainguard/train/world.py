"""Data-parallel processes on torch.distributed: the recipe's `distributed` section, the process
group from torchrun's environment, and the collectives trainguard itself needs.

Launched by `trainguard run --nproc N` or by an external `torchrun`, every process reads RANK,
WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT from its environment (torchrun sets them). Without
them the run is one process and nothing here talks to the network.

Two groups:
- the default group (gloo on CPU, nccl on GPU) carries the gradients through DDP. Its timeout
  is long while the run warms up (data preparation, the first step) and becomes
  `collective_timeout_s` after `warmup_steps` steps, so a hung rank is noticed in seconds
  rather than the backend's default 30 minutes;
- a gloo "monitor" group with a long timeout (`guard.distributed.group.MonitorGroup`) carries
  trainguard's own traffic: monitored barriers (the only collective that names the ranks that
  did not arrive), the resume step, replica hashes and straggler timings. It never waits on the
  GPU.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from trainguard.config.distributed import DistributedConfig
from trainguard.errors import ConfigError
from trainguard.guard.distributed.group import MonitorGroup


@dataclass
class World:
    """This process's place among the data-parallel ranks (1 process by default)."""

    rank: int = 0
    size: int = 1

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return t
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t / self.size


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def env_world_size(env: dict[str, str] | None = None) -> int:
    return int((env if env is not None else os.environ).get("WORLD_SIZE", "1"))


@dataclass
class Dist:
    """This process's place in the job and the collectives trainguard uses."""

    world: World = field(default_factory=World)
    config: DistributedConfig = field(default_factory=DistributedConfig)
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = "none"
    group: MonitorGroup | None = None  # the gloo monitor group; None with one process

    @property
    def active(self) -> bool:
        return self.world.size > 1

    @property
    def hosts(self) -> list[str]:
        return self.group.hosts if self.group is not None else [socket.gethostname()]

    @property
    def host(self) -> str:
        return self.hosts[self.world.rank]

    # -- trainguard's own collectives, on the gloo monitor group ---------------------------------
    def barrier(self, timeout_s: float | None = None, wait_all_ranks: bool = True) -> None:
        """A monitored barrier: raises naming the ranks that did not arrive within the timeout."""
        if self.group is not None:
            self.group.barrier(timeout_s, wait_all_ranks)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return self.group.broadcast_object(obj, src) if self.group is not None else obj

    def all_gather_object(self, obj: Any) -> list[Any]:
        return self.group.all_gather_object(obj) if self.group is not None else [obj]

    # -- the gradient group ----------------------------------------------------------------------
    def wrap(self, model: torch.nn.Module, precision: str) -> torch.nn.Module | None:
        """The DDP wrapper (None for one process). bf16: gradients reduced with fp32 sums."""
        if not self.active:
            return None
        return wrap_ddp(model, self.device, precision, self.config.fp32_reduce)

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()


def wrap_ddp(
    model: torch.nn.Module, device: torch.device, precision: str, fp32_reduce: bool = True
) -> torch.nn.parallel.DistributedDataParallel:
    """DDP over the default group. In bf16, gradients are averaged by numerics'
    `fp32_accumulate_hook`: upcast, fp32 all-reduce, one rounding back (no swamping, N101)."""
    ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if precision == "bf16" and fp32_reduce:
        from trainguard.numerics import fp32_accumulate_hook

        ddp.register_comm_hook(None, fp32_accumulate_hook)
    return ddp


def _choose_backend(config: DistributedConfig, local_world_size: int) -> str:
    """nccl when this machine has a GPU for every local rank, else gloo. Decided from values
    every local rank shares, so that no two ranks of one job pick different backends."""
    if config.backend != "auto":
        return config.backend
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return "nccl" if gpus >= local_world_size else "gloo"


def init_distributed(
    config: DistributedConfig, batch_size: int, env: dict[str, str] | None = None
) -> Dist:
    """Join the job torchrun described in the environment; one process when there is none."""
    env = dict(os.environ if env is None else env)
    size = env_world_size(env)
    if size <= 1:
        return Dist(config=config)
    rank, local_rank = int(env["RANK"]), int(env.get("LOCAL_RANK", "0"))
    if batch_size % size:
        raise ConfigError(
            f"train.batch_size={batch_size} is not divisible by the {size} processes",
            f"use a process count that divides {batch_size}, or change train.batch_size "
            "(the global batch must not depend on the process count)",
        )
    local_size = int(env.get("LOCAL_WORLD_SIZE", str(size)))
    backend = _choose_backend(config, local_size)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(
            backend, rank=rank, world_size=size, timeout=_td(config.init_timeout_s)
        )
    return Dist(
        world=World(rank, size),
        config=config,
        local_rank=local_rank,
        device=device,
        backend=backend,
        group=MonitorGroup.create(config.sync_timeout_s),
    )
