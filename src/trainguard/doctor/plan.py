"""What the doctor runs: sizes per mode (--quick or full) and device, dtype, timeouts, storage.

Everything comes from the recipe: the dtype (`train.precision`), where checkpoints go
(`checkpoint.dir`, default `runs/<name>/checkpoints` as `trainguard run` would use), and the
timeouts (`distributed.hang_timeout_s` for anything that may not answer: a rank, a store;
`distributed.collective_timeout_s` for each collective).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one mode on one kind of device."""

    matmul_n: int
    reps: int
    """Timed repetitions of each compute check; the fastest counts (the intrinsic time)."""
    attention: tuple[int, int, int, int]
    """(batch, heads, sequence, head dim) of the attention block."""
    burn_s: float
    """Target duration of the sustained burn."""
    host_mib: int
    device_fraction: float
    """Share of the free device memory the device-memory check fills (CUDA)."""
    storage_mib: int
    collective_bytes: tuple[int, ...]
    collective_iters: int
    link_bytes: int


_MIB = 1 << 20
SIZES = {
    ("cpu", True): Sizes(384, 7, (1, 8, 256, 64), 0.3, 32, 0.0, 4, (256 << 10, 2 * _MIB), 3, _MIB),
    ("cpu", False): Sizes(
        768, 7, (4, 16, 512, 64), 4.0, 512, 0.0, 64, (64 << 10, _MIB, 16 * _MIB), 5, 8 * _MIB
    ),
    ("cuda", True): Sizes(
        2048, 5, (4, 16, 1024, 64), 1.0, 64, 0.1, 16, (_MIB, 16 * _MIB), 5, 16 * _MIB
    ),
    ("cuda", False): Sizes(
        8192,
        5,
        (8, 32, 2048, 128),
        10.0,
        1024,
        0.5,
        256,
        (_MIB, 16 * _MIB, 256 * _MIB),
        10,
        64 * _MIB,
    ),
}


@dataclass(frozen=True)
class DoctorPlan:
    """One doctor invocation's settings; the same on every rank."""

    quick: bool = True
    dtype: str = "fp32"
    checkpoint_dir: str = "runs/default/checkpoints"
    storage_options: dict[str, Any] = field(default_factory=dict)
    hang_timeout_s: float = 60.0
    collective_timeout_s: float = 300.0

    def sizes(self, device: torch.device) -> Sizes:
        return SIZES[("cuda" if device.type == "cuda" else "cpu", self.quick)]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        return {
            "quick": self.quick,
            "dtype": self.dtype,
            "checkpoint_dir": self.checkpoint_dir,
            "hang_timeout_s": self.hang_timeout_s,
            "collective_timeout_s": self.collective_timeout_s,
        }


def plan_for(recipe: Any, quick: bool, checkpoint_dir: str | Path | None = None) -> DoctorPlan:
    """The plan for a validated recipe (`config.schema.Recipe`); `checkpoint_dir` overrides
    the default folder (a run passes its own run dir's)."""
    folder = recipe.checkpoint.dir or str(
        checkpoint_dir or Path("runs") / recipe.name / "checkpoints"
    )
    return DoctorPlan(
        quick=quick,
        dtype=recipe.train.precision,
        checkpoint_dir=str(folder),
        storage_options=dict(recipe.checkpoint.storage_options),
        hang_timeout_s=recipe.distributed.hang_timeout_s,
        collective_timeout_s=recipe.distributed.collective_timeout_s,
    )
