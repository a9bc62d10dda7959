"""This process's environment: the software that ran a step and the settings that change its
numbers. One reader for every record of it: the run record's `run.json` (`metrics/record.py`),
`trainguard run`'s start event and checkpoints (`train/envinfo.py`: drift, H101), and
`doctor`'s per-rank comparison (`doctor/environment.py`). It lives on the primitives' floor so
that a run record written by any loop (the Guard, the Trainer, Lightning) carries it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import trainguard


def nvml() -> Any | None:
    """The initialised `pynvml` module, or None (not installed, no driver, no permission)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # not installed, no driver, no permission: nothing to read
        return None


def driver_version() -> str | None:
    nv = nvml()
    if nv is None:
        return None
    try:
        v = nv.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def software_versions() -> dict[str, str | None]:
    """Versions that must match across ranks: Python, torch, CUDA, cuDNN, NCCL, the driver."""
    import torch

    cuda = torch.cuda.is_available()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    nccl = None
    if cuda and torch.distributed.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "trainguard": trainguard.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None if cudnn is None else str(cudnn),
        "nccl": nccl,
        "driver": driver_version() if cuda else None,
    }


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
    import torch

    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(0)}"
    return f"cpu:{platform.processor() or platform.machine()}"


def environment_fingerprint() -> dict[str, Any]:
    """This process's software and its settings that change numbers. CUDA, cuDNN, NCCL and the
    driver come from `software_versions` (one reader for both)."""
    import numpy as np
    import torch

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
