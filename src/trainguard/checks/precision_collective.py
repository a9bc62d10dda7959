"""The real collective: torch.distributed all_reduce numerics, measured on real processes.

`measure_collective(world_size, dtype)` spawns `world_size` local processes (gloo on
127.0.0.1, a free port; any count the open-file limit allows), gives rank r the r-th simulated
gradient in `dtype` and reduces it three ways: the native `all_reduce` in the dtype,
`fp32_accumulate_allreduce`, and a real DDP model whose gradient buckets go through
`fp32_accumulate_hook`. Under torchrun, `measure_in_job` does the same on the job's own ranks
(several machines, nccl on GPUs). Rank 0's results are regressed on the float64 sum exactly as
the simulation is (N101 bias, N102 noise); `precision_reduction.scale_verdict` says whether a
size can show the bias the simulation predicts at scale at all.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
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
from trainguard.errors import BadInputError, TrainguardError
from trainguard.findings import Finding
from trainguard.numerics.comm_hook import fp32_accumulate_allreduce, fp32_accumulate_hook
from trainguard.numerics.reduction import ReductionAudit, dtype_of, entry_scale, fit_with_stderr
from trainguard.numerics.reduction import simulate_gradients as simulate
from trainguard.util.processes import die_with_launcher, launcher_token

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


def reduce_in_group(
    rank: int, world: int, dtype: str, n: int, seed: int, ddp: bool, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """On every rank of the default process group: reduce this rank's row of
    `simulate_gradients(world, n, dtype, seed)` three ways (see the module docstring). Returns
    the reduced sums as float64 on the CPU (the same on every rank)."""
    g = simulate(world, n, dtype_of(dtype), seed)[rank].to(device)
    results = {}
    t = g.clone()
    dist.all_reduce(t)  # native: summed in the dtype
    results["all_reduce"] = t
    results["fp32-accumulate"] = fp32_accumulate_allreduce(g.clone())
    if ddp:
        model = nn.parallel.DistributedDataParallel(_GradientVector(n, g.dtype).to(device))
        model.register_comm_hook(None, fp32_accumulate_hook)
        model(g).backward()
        # DDP averages; the mean times the world size (in float64: any world size) is the sum.
        results["ddp-fp32-hook"] = model.module.w.grad.detach().double() * world
    return {k: v.detach().double().cpu() for k, v in results.items()}


def _worker(
    rank: int,
    world: int,
    port: int,
    dtype: str,
    n: int,
    seed: int,
    out: str,
    ddp: bool,
    launcher: str,
) -> None:
    # A child of the fork server, not of the command: it watches the command itself.
    die_with_launcher(launcher)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, init_method="env://", timeout=timedelta(seconds=300)
    )
    try:
        results = reduce_in_group(rank, world, dtype, n, seed, ddp)
        if rank == 0:
            torch.save(results, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def check_process_count(world_size: int) -> None:
    """BadInputError unless `world_size` local processes can form a gloo group here: at least
    two, and within the open-file limit (gloo connects every pair of ranks)."""
    if world_size < 2:
        raise BadInputError(
            f"--nproc {world_size}: a collective needs at least 2 processes",
            "use --nproc 2 or more",
        )
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = world_size + 64  # a socket per peer, plus the interpreter's own files
    if soft != resource.RLIM_INFINITY and need > soft:
        raise BadInputError(
            f"--nproc {world_size}: each process holds a socket per peer, but the open-file "
            f"limit is {soft}",
            f"raise it (ulimit -n {need}) or run `trainguard check-precision` under torchrun "
            "across machines (every rank joins, rank 0 reports)",
        )


def collective_results(
    world_size: int,
    dtype: str,
    n_elements: int = 4096,
    seed: int = 0,
    ddp: bool = True,
    timeout: float | None = None,
) -> dict[str, torch.Tensor]:
    """Rank 0's reduced sums (float64) per method in `METHODS` (without "ddp-fp32-hook" when
    `ddp` is False: DDP's first use imports torch._dynamo, seconds per process), from
    `world_size` local gloo processes each holding its row of `simulate_gradients(...)`.
    `timeout` defaults to 120 s plus 3 s per process (they share this machine's cores)."""
    dtype_of(dtype)
    check_process_count(world_size)
    timeout = 120.0 + 3.0 * world_size if timeout is None else timeout
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rank0.pt")
        args = (world_size, free_port(), dtype, n_elements, seed, out, ddp, launcher_token())
        # A fork server imports torch once per session; each worker then forks from it in a
        # fraction of a second instead of re-importing torch, and never inherits a parent's
        # OpenMP thread pool. (Preloading torch._dynamo, which DDP imports, can deadlock the
        # fork: its import starts threads.)
        multiprocessing.set_forkserver_preload([__name__])
        ctx = None
        try:
            ctx = mp.start_processes(
                _worker, args=args, nprocs=world_size, start_method="forkserver", join=False
            )
            deadline = time.monotonic() + timeout
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no result after {timeout:.0f} s")
        except Exception as e:  # a worker died or hung: surface it as a clear error
            raise CollectiveError(
                f"the gloo process group of {world_size} local processes failed: {e}",
                "check that 127.0.0.1 accepts local TCP connections and that torch.distributed "
                "is available",
            ) from e
        finally:  # a timeout, a failed peer, Ctrl-C: no worker outlives the measurement
            for p in ctx.processes if ctx is not None else ():
                if p.is_alive():
                    p.kill()
        return torch.load(out, weights_only=True)


def audits_of(
    results: dict[str, torch.Tensor],
    world_size: int,
    dtype: str,
    n_elements: int,
    seed: int,
    source: str = "gloo",
) -> list[ReductionAudit]:
    """Bias and noise of each method's reduced sum, fitted exactly as the simulation is."""
    x = simulate(world_size, n_elements, dtype_of(dtype), seed)
    exact, scale = x.double().sum(0), entry_scale(x)
    audits = []
    for method in results:
        slope, noise, se = fit_with_stderr(results[method], exact, scale)
        audits.append(
            ReductionAudit(
                dtype, method, world_size, n_elements, slope, abs(1 - slope), noise, source, se
            )
        )
    return audits


def measure_collective(
    world_size: int, dtype: str, n_elements: int = 4096, seed: int = 0, ddp: bool = True
) -> list[ReductionAudit]:
    """Bias and noise of the real gloo all_reduce, the fp32-accumulating all_reduce and DDP
    with `fp32_accumulate_hook`, for `world_size` local processes."""
    results = collective_results(world_size, dtype, n_elements, seed, ddp)
    return audits_of(results, world_size, dtype, n_elements, seed)


def measure_in_job(
    dtype: str, n_elements: int = 4096, seed: int = 0, ddp: bool = True
) -> tuple[int, list[ReductionAudit]]:
    """Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR in the environment): every rank of the job
    joins the measurement at the job's own size (several machines included; nccl on GPUs,
    gloo on CPUs). Returns (rank, audits); the audits on rank 0, [] on the others."""
    dtype_of(dtype)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = "cpu"
    if torch.cuda.is_available():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        torch.cuda.set_device(device)
    backend = "nccl" if device != "cpu" else "gloo"
    try:
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=600))
    except Exception as e:  # noqa: BLE001 - the rendezvous failed: say so, not a traceback
        raise CollectiveError(
            f"rank {rank} of {world} could not join the {backend} process group: {e}",
            "check the torchrun rendezvous (--rdzv-endpoint) and that the ranks reach each other",
        ) from e
    try:
        results = reduce_in_group(rank, world, dtype, n_elements, seed, ddp, device)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return rank, []
    return rank, audits_of(results, world, dtype, n_elements, seed, source=backend)


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
