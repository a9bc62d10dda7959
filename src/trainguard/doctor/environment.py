"""The rank's environment: software versions, threads and cores, and the communication
settings known to cause hangs or slowness (H414). Comparisons across ranks (different
versions H415, different settings H416, oversubscribed hosts H417) are in `fleet.py`.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping
from typing import Any

import torch

from trainguard.doctor.report import LocalResult, RankContext
from trainguard.metrics.environment import cpu_model as cpu_model
from trainguard.metrics.environment import software_versions as software_versions
from trainguard.util.processes import available_cores

# Variables compared across ranks: a value set on some hosts only is a classic hang.
COMM_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_")
COMM_EXTRA = ("OMP_NUM_THREADS", "CUDA_LAUNCH_BLOCKING", "PYTORCH_NO_CUDA_MEMORY_CACHING")


def _is(value: str) -> Callable[[str], bool]:
    return lambda v: v.strip().lower() == value


def _any_value(v: str) -> bool:
    return v.strip() != ""


# (variable, does this value hurt?, why). Each reason names the effect, not just the name.
SUSPECT_SETTINGS: tuple[tuple[str, Callable[[str], bool], str], ...] = (
    (
        "NCCL_P2P_DISABLE",
        _is("1"),
        "disables NVLink/PCIe peer-to-peer: intra-node traffic goes through host memory, "
        "several times slower",
    ),
    (
        "NCCL_SHM_DISABLE",
        _is("1"),
        "disables shared-memory transport between local processes: slower intra-node traffic",
    ),
    (
        "NCCL_IB_DISABLE",
        _is("1"),
        "disables InfiniBand/RoCE: inter-node traffic over TCP sockets, 10-100x slower",
    ),
    (
        "NCCL_ASYNC_ERROR_HANDLING",
        _is("0"),
        "collective timeouts are not enforced: a dead rank hangs the job forever",
    ),
    (
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        _is("0"),
        "collective timeouts are not enforced: a dead rank hangs the job forever",
    ),
    (
        "TORCH_NCCL_ENABLE_MONITORING",
        _is("0"),
        "the heartbeat monitor that ends a stuck NCCL watchdog is off: a hang stays a hang",
    ),
    (
        "NCCL_BLOCKING_WAIT",
        _is("1"),
        "the host blocks on every collective (no overlap of communication and compute)",
    ),
    (
        "TORCH_NCCL_BLOCKING_WAIT",
        _is("1"),
        "the host blocks on every collective (no overlap of communication and compute)",
    ),
    (
        "CUDA_LAUNCH_BLOCKING",
        _is("1"),
        "every kernel launch waits for the GPU (a debugging setting): several times slower",
    ),
    (
        "TORCH_DISTRIBUTED_DEBUG",
        _is("detail"),
        "checks every collective's shapes with an extra collective: slower steps",
    ),
    (
        "NCCL_DEBUG",
        lambda v: v.strip().upper() == "TRACE",
        "logs every collective call: slow, and huge logs",
    ),
    (
        "NCCL_ALGO",
        _any_value,
        "forces one collective algorithm for every message size: usually slower",
    ),
    ("NCCL_PROTO", _any_value, "forces one protocol for every message size: usually slower"),
    (
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        _is("1"),
        "every tensor allocation goes to cudaMalloc: much slower",
    ),
    (
        "OMP_WAIT_POLICY",
        _is("active"),
        "idle OpenMP threads spin: several times slower whenever cores are shared",
    ),
)


def suspect_settings(env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(variable, value, why) for each setting in `env` known to cause hangs or slowness."""
    return [(k, env[k], why) for k, hurts, why in SUSPECT_SETTINGS if k in env and hurts(env[k])]


def comm_settings(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(COMM_PREFIXES) or k in COMM_EXTRA}


def collect_environment(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if env is None else env
    cores = available_cores()  # the cores `--nproc` is checked against, counted the same way
    return {
        "versions": software_versions(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": cores,
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "local_world_size": int(env.get("LOCAL_WORLD_SIZE", "1")),
        "comm": comm_settings(env),
    }


def check_environment(ctx: RankContext) -> LocalResult:
    out = LocalResult()
    info = collect_environment()
    out.figures["environment"] = info
    for var, value, why in suspect_settings(os.environ):
        out.findings.append(ctx.who.finding("H414", f"{var}={value}: {why}", variable=var))
    return out
