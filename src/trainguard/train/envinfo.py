"""The environment fingerprint: what software ran a checkpoint (or a reference curve), so that
drift on resume, and against a reference, is visible (H101)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

import trainguard
from trainguard.doctor.environment import cpu_model, software_versions
from trainguard.findings import Finding

# Keys whose change between a checkpoint (or a reference) and this process is software drift
# (H101). cuda, cudnn, nccl and driver are None on a CPU machine.
DRIFT_KEYS = (
    "python",
    "torch",
    "numpy",
    "trainguard",
    "platform",
    "git_revision",
    "device",
    "cuda",
    "cudnn",
    "nccl",
    "driver",
)
# What must be equal for a CPU run to repeat another bitwise: the software that computes
# (trainguard's own version and revision are left out: a change there is what a reference
# comparison exists to catch), the CPU model (kernels dispatch on its instruction set), the
# intra-op thread count (it changes the order of reductions) and the number of processes (it
# changes how the gradient mean is summed).
BITWISE_KEYS = (
    *(k for k in DRIFT_KEYS if k not in ("trainguard", "git_revision")),
    "cpu",
    "torch_threads",
    "world_size",
)


def git_revision(start: Path | None = None) -> str | None:
    """The project's git revision when the package runs from a checkout, else None."""
    here = start or Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    rev = out.stdout.strip()
    return rev if out.returncode == 0 and len(rev) == 40 else None


def device_name() -> str:
    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(0)}"
    return f"cpu:{platform.processor() or platform.machine()}"


def environment_fingerprint() -> dict[str, Any]:
    """This process's software and its settings that change numbers. CUDA, cuDNN, NCCL and the
    driver come from `doctor`'s `software_versions` (one reader for both)."""
    versions = software_versions()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "trainguard": trainguard.__version__,
        "platform": platform.platform(),
        "git_revision": git_revision(),
        "device": device_name(),
        **{k: versions[k] for k in ("cuda", "cudnn", "nccl", "driver")},
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),  # torchrun's; 1 alone
        "executable": sys.executable,
    }


def environment_changes(
    saved: dict[str, Any], current: dict[str, Any], keys: tuple[str, ...] = DRIFT_KEYS
) -> dict[str, dict[str, Any]]:
    """`{key: {"then": saved value, "now": current value}}` for each of `keys` that differs.
    A key missing on one side (a fingerprint from an older trainguard) reads as None."""
    return {
        k: {"then": saved.get(k), "now": current.get(k)}
        for k in keys
        if saved.get(k) != current.get(k)
    }


def drift_findings(
    saved: dict[str, Any], current: dict[str, Any], step: int | None, against: str | None = None
) -> list[Finding]:
    """An H101 warning listing every software component that changed since `against` (default:
    the checkpoint of `step`) was written; none when nothing changed."""
    changed = environment_changes(saved, current)
    if not changed:
        return []
    against = against or f"the checkpoint of step {step} was written"
    names = ", ".join(f"{k} {v['then']} -> {v['now']}" for k, v in changed.items())
    return [
        Finding.of(
            "H101",
            f"software changed since {against}: {names}",
            step=step,
            data={"changed": changed, "against": against},
        )
    ]
