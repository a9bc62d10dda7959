"""`Guard(distributed=...)`'s multi-process part, built from what the user passed."""

from __future__ import annotations

from typing import Any

from trainguard.config.distributed import DistributedConfig
from trainguard.guard.distributed.guards import DistributedGuards


def distributed_part(distributed: Any, guard: Any) -> DistributedGuards:
    """`True`, a `DistributedConfig` or a ready `DistributedGuards` (trainguard run builds
    its own). A hung rank's finding goes to the guard's log."""
    if isinstance(distributed, DistributedGuards):
        return distributed
    config = distributed if isinstance(distributed, DistributedConfig) else None
    part = DistributedGuards(
        config,
        run_dir=guard.run_dir,
        max_rollbacks=guard.config.max_rollbacks,
        on_hang=lambda f: guard._log_findings([f]),
    )
    part.start()  # ranks the launcher stops (a hung one among them) dump their stacks
    return part
