"""Replica consistency (H201): data-parallel ranks must hold bitwise the same parameters.

They start equal (DDP broadcasts rank 0's weights) and apply the same all-reduced gradients
with the same optimizer, so on a healthy job their bytes are identical. Every K steps each rank
hashes its parameters (xxh3 over the raw bytes, in parameter order; optionally the optimizer
state), the hashes are all-gathered, and a rank outside the majority is named with its host.
Silent data corruption (a flipped bit in memory or an ALU) shows up here and nowhere else.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import torch
import xxhash

import trainguard.codes.distributed  # noqa: F401  (registers H201)
from trainguard.findings import Finding
from trainguard.train.optim import Optimizer

if TYPE_CHECKING:
    from trainguard.train.distributed import Dist


def _update(h: xxhash.xxh3_64, t: torch.Tensor) -> None:
    # Raw bytes, not values: -0.0 vs 0.0 and NaN payloads are differences too.
    flat = t.detach().contiguous().view(-1)
    h.update(flat.view(torch.uint8).cpu().numpy().tobytes() if flat.numel() else b"")


def replica_digest(model: torch.nn.Module, optimizer: Optimizer | None = None) -> str:
    """xxh3-64 of every parameter's bytes (and, if given, the optimizer's tensor state)."""
    h = xxhash.xxh3_64()
    for p in model.parameters():
        _update(h, p)
    if optimizer is not None:
        for p in model.parameters():
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                if isinstance(value, torch.Tensor):
                    h.update(key.encode())
                    _update(h, value)
    return h.hexdigest()


def compare_replicas(digests: list[str], hosts: list[str], step: int | None) -> list[Finding]:
    """H201 when the ranks' digests are not all equal; pure, so testable without processes.

    The majority digest is the reference and every other rank is named. With no strict
    majority (two ranks, or an even split) the odd one cannot be told by vote, and no rank,
    rank 0 included, is assumed right: all are named as suspects. The rollback that follows
    repairs every rank either way, since all reload the same checkpoint.
    """
    counts = Counter(digests)
    if len(counts) <= 1:
        return []
    top, n_top = counts.most_common(1)[0]
    majority = n_top * 2 > len(digests)
    if majority:
        suspects = [r for r, d in enumerate(digests) if d != top]
    else:
        suspects = list(range(len(digests)))
    named = ", ".join(f"rank {r} ({hosts[r] if r < len(hosts) else '?'})" for r in suspects)
    if majority:
        message = (
            f"{named} hold{'s' if len(suspects) == 1 else ''} different parameters from the "
            f"other {n_top} of {len(digests)} replicas: silent corruption or a desynchronised rank"
        )
    else:
        message = (
            f"the {len(digests)} replicas disagree with no majority ({len(counts)} distinct "
            f"parameter hashes); suspects: {named}"
        )
    return [
        Finding.of(
            "H201",
            message,
            step=step,
            rank=suspects[0] if majority and len(suspects) == 1 else None,
            where=", ".join(hosts[r] for r in suspects if r < len(hosts)),
            data={
                "suspect_ranks": suspects,
                "suspect_hosts": [hosts[r] for r in suspects if r < len(hosts)],
                "digests": digests,
                "majority": majority,
            },
        )
    ]


def check_replicas(
    dist: Dist,
    model: torch.nn.Module,
    optimizer: Optimizer | None,
    step: int,
) -> list[Finding]:
    """Hash this rank's replica, gather every rank's hash, compare. A collective: every rank
    calls it at the same step, and every rank gets the same findings."""
    include = optimizer if dist.config.replica_check_optimizer else None
    digests = dist.all_gather_object(replica_digest(model, include))
    return compare_replicas([str(d) for d in digests], dist.hosts, step)
