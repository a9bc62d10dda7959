"""The real collective: torch.distributed all_reduce numerics, measured with gloo processes.

`measure_collective(world_size, dtype)` spawns `world_size` local processes (gloo on
127.0.0.1, a free port), gives rank r the r-th simulated gradient in `dtype` and reduces it
three ways: the native `all_reduce` in the dtype, `fp32_accumulate_allreduce`, and a real DDP
model whose gradient buckets go through `fp32_accumulate_hook`. Rank 0's results are regressed
on the float64 sum exactly as the simulation is (N101 bias, N102 noise).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from trainguard.checks.precision_reduction import reduction_findings
from trainguard.errors import TrainguardError
from trainguard.findings import Finding
from trainguard.numerics.comm_hook import fp32_accumulate_allreduce, fp32_accumulate_hook
from trainguard.numerics.reduction import ReductionAudit, dtype_of, entry_scale, fit_with_stderr
from trainguard.numerics.reduction import simulate_gradients as simulate

METHODS = ("all_reduce", "fp32-accumulate", "ddp-fp32-hook")


class CollectiveError(TrainguardError):
    """The local process group could not be started or a worker failed."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _GradientVector(nn.Module):
    """loss = <w, g>: the gradient of w is exactly g, so DDP reduces the rank's g."""

    def __init__(self, n: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n, dtype=dtype))

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return (self.w * g).sum()


def _worker(
    rank: int, world: int, port: int, dtype: str, n: int, seed: int, out: str, ddp: bool
) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, init_method="env://", timeout=timedelta(seconds=120)
    )
    try:
        g = simulate(world, n, dtype_of(dtype), seed)[rank]
        results = {}
        t = g.clone()
        dist.all_reduce(t)  # native: summed in the dtype
        results["all_reduce"] = t
        results["fp32-accumulate"] = fp32_accumulate_allreduce(g.clone())
        if ddp:
            model = nn.parallel.DistributedDataParallel(_GradientVector(n, g.dtype))
            model.register_comm_hook(None, fp32_accumulate_hook)
            model(g).backward()
            # DDP averages; times the world size (a power of two here: exact) is the sum.
            results["ddp-fp32-hook"] = model.module.w.grad.detach() * world
        if rank == 0:
            torch.save({k: v.double() for k, v in results.items()}, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def collective_results(
    world_size: int,
    dtype: str,
    n_elements: int = 4096,
    seed: int = 0,
    ddp: bool = True,
    timeout: float = 300.0,
) -> dict[str, torch.Tensor]:
    """Rank 0's reduced sums (float64) per method in `METHODS` (without "ddp-fp32-hook" when
    `ddp` is False: DDP's first use imports torch._dynamo, seconds per process), from
    `world_size` local gloo processes each holding its row of `simulate_gradients(...)`."""
    dtype_of(dtype)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rank0.pt")
        args = (world_size, free_port(), dtype, n_elements, seed, out, ddp)
        # A fork server imports torch once per session; each worker then forks from it in a
        # fraction of a second instead of re-importing torch, and never inherits a parent's
        # OpenMP thread pool. (Preloading torch._dynamo, which DDP imports, can deadlock the
        # fork: its import starts threads.)
        multiprocessing.set_forkserver_preload([__name__])
        try:
            ctx = mp.start_processes(
                _worker, args=args, nprocs=world_size, start_method="forkserver", join=False
            )
            deadline = time.monotonic() + timeout
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    for p in ctx.processes:
                        p.kill()
                    raise TimeoutError(f"no result after {timeout:.0f} s")
        except Exception as e:  # a worker died or hung: surface it as a clear error
            raise CollectiveError(
                f"the gloo process group of {world_size} local processes failed: {e}",
                "check that 127.0.0.1 accepts local TCP connections and that torch.distributed "
                "is available",
            ) from e
        return torch.load(out, weights_only=True)


def measure_collective(
    world_size: int, dtype: str, n_elements: int = 4096, seed: int = 0, ddp: bool = True
) -> list[ReductionAudit]:
    """Bias and noise of the real gloo all_reduce, the fp32-accumulating all_reduce and DDP
    with `fp32_accumulate_hook`, for `world_size` local processes."""
    results = collective_results(world_size, dtype, n_elements, seed, ddp)
    x = simulate(world_size, n_elements, dtype_of(dtype), seed)
    exact, scale = x.double().sum(0), entry_scale(x)
    audits = []
    for method in results:
        slope, noise, se = fit_with_stderr(results[method], exact, scale)
        audits.append(
            ReductionAudit(
                dtype, method, world_size, n_elements, slope, abs(1 - slope), noise, "gloo", se
            )
        )
    return audits


def check_collective(
    dtype: str,
    world_sizes: tuple[int, ...] = (2, 4),
    n_elements: int = 4096,
    seed: int = 0,
    ddp: bool = True,
) -> tuple[list[Finding], list[ReductionAudit]]:
    """N101/N102 findings of the real collectives at each world size."""
    findings: list[Finding] = []
    audits: list[ReductionAudit] = []
    for world in world_sizes:
        for audit in measure_collective(world, dtype, n_elements, seed, ddp):
            audits.append(audit)
            findings += reduction_findings(audit)
    return findings, audits
