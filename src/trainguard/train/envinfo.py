"""The environment fingerprint: what software ran a checkpoint, so drift on resume is visible."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

import trainguard
from trainguard.findings import Finding

# Keys whose change between a checkpoint and the resuming process is software drift (H101).
DRIFT_KEYS = ("python", "torch", "numpy", "trainguard", "platform", "git_revision", "device")


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
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "trainguard": trainguard.__version__,
        "platform": platform.platform(),
        "git_revision": git_revision(),
        "device": device_name(),
        "torch_threads": torch.get_num_threads(),
        "executable": sys.executable,
    }


def drift_findings(saved: dict[str, Any], current: dict[str, Any], step: int) -> list[Finding]:
    """A warning per software component that changed since the checkpoint was written."""
    changed = {
        k: {"checkpoint": saved.get(k), "now": current.get(k)}
        for k in DRIFT_KEYS
        if saved.get(k) != current.get(k)
    }
    if not changed:
        return []
    names = ", ".join(f"{k} {v['checkpoint']} -> {v['now']}" for k, v in changed.items())
    return [
        Finding.of(
            "H101",
            f"software changed since the checkpoint of step {step} was written: {names}",
            step=step,
            data={"changed": changed},
        )
    ]
