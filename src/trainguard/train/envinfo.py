"""The environment fingerprint: what software ran a checkpoint (or a reference curve), so that
drift on resume, and against a reference, is visible (H101)."""

from __future__ import annotations

from typing import Any

from trainguard.findings import Finding
from trainguard.metrics.environment import device_name as device_name
from trainguard.metrics.environment import environment_fingerprint as environment_fingerprint
from trainguard.metrics.environment import git_revision as git_revision

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
