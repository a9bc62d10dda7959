"""The machine a benchmark ran on, printed beside its figures by every script here.

A CPU figure means little without the CPU: whether torch can use AVX-512, bf16 dot products
(`avx512_bf16`, `amx_bf16`) or only AVX2 changes some ratios by an order of magnitude. So each
benchmark prints this line, and docs/benchmarks.md quotes it next to the figures.

    python benchmarks/machine.py
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

# The instruction sets that decide the speed of torch's CPU kernels (x86 and Arm names).
RELEVANT_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "asimdhp",
    "bf16",
    "i8mm",
    "sve",
    "sve2",
)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (Linux); empty elsewhere."""
    path = Path("/proc/cpuinfo")
    if not path.exists():
        return {}
    fields: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model() -> str:
    info = _cpuinfo()
    return info.get("model name") or info.get("Model") or platform.processor() or "unknown CPU"


def cpu_flags() -> list[str]:
    """The relevant instruction-set flags this CPU reports, in RELEVANT_FLAGS order."""
    info = _cpuinfo()
    have = set((info.get("flags") or info.get("Features") or "").split())
    return [f for f in RELEVANT_FLAGS if f in have]


def describe() -> str:
    """One line: CPU model, cores, relevant flags, torch and its CPU capability, any GPU."""
    parts = [
        f"CPU: {cpu_model()}, {os.cpu_count()} logical cores, "
        f"flags {' '.join(cpu_flags()) or 'none of ' + '/'.join(RELEVANT_FLAGS[:4])}",
    ]
    try:
        import torch

        parts.append(
            f"torch {torch.__version__} (CPU kernels: {torch.backends.cpu.get_cpu_capability()})"
        )
        if torch.cuda.is_available():
            parts.append(f"GPU: {torch.cuda.get_device_name(0)}")
        else:
            parts.append("no GPU")
    except ImportError:
        parts.append("torch not installed")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    parts.append(f"Python {platform.python_version()}, load average {load:.1f}")
    return "; ".join(parts)


if __name__ == "__main__":
    print(describe(), file=sys.stdout)
