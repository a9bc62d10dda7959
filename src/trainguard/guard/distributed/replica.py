"""Replica consistency (H201): ranks that hold the same part of the model must hold the same
bytes.

Data-parallel replicas start equal (DDP broadcasts rank 0's weights) and apply the same
all-reduced gradients with the same optimizer, so on a healthy job their bytes are identical.
Every K steps each rank hashes its parameters (xxh3 over the raw bytes, in parameter order;
optionally the optimizer state), the hashes are all-gathered, and in every replica set a rank
outside the majority is named with its host. Silent data corruption (a flipped bit in memory or
an ALU) shows up here and nowhere else.

Which ranks are replicas of each other comes from the parameters themselves:
- plain tensors (DDP, or one replica of anything): every rank holds the whole model, one set;
- DTensors (FSDP2 `fully_shard`, HSDP): the ranks that differ only along the mesh dimensions
  the parameters are `Replicate()` on hold the same shard; HSDP on a (replicate, shard) mesh
  gives one set per shard index. Plain FSDP2 (a 1-D sharded mesh) has no replicas: every rank
  holds a different shard, and there is nothing to compare (H203 says so, once).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch
import xxhash

from trainguard.findings import Finding


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, the tensor itself otherwise."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _update(h: xxhash.xxh3_64, t: torch.Tensor) -> None:
    # Raw bytes, not values: -0.0 vs 0.0 and NaN payloads are differences too.
    flat = _local(t).detach().contiguous().view(-1)
    h.update(flat.view(torch.uint8).cpu().numpy().tobytes() if flat.numel() else b"")


def replica_digest(model: torch.nn.Module, optimizer: Any = None) -> str:
    """xxh3-64 of every parameter's local bytes (and, if given, the optimizer's tensor state)."""
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


def replica_sets(model: torch.nn.Module, world_size: int) -> list[list[int]]:
    """Groups of global ranks that must hold bitwise the same local parameters (see above)."""
    for p in model.parameters():
        mesh, placements = getattr(p, "device_mesh", None), getattr(p, "placements", None)
        if mesh is None or placements is None:
            continue
        ranks = mesh.mesh  # (d0, d1, ...) tensor of global ranks
        replicate = [i for i, pl in enumerate(placements) if pl.is_replicate()]
        other = [i for i in range(ranks.dim()) if i not in replicate]
        width = math.prod(ranks.shape[i] for i in replicate)
        rows = ranks.permute(*other, *replicate).reshape(-1, width)
        return [[int(r) for r in row] for row in rows.tolist()]
    return [list(range(world_size))]


def merge_sets(per_rank: list[list[list[int]]]) -> list[list[int]]:
    """The distinct replica sets every rank reported (with pipeline stages, each rank sees its
    own stage's mesh), in a deterministic order so that every rank decides the same."""
    return sorted({tuple(s) for sets in per_rank for s in sets}, key=lambda s: (s[0], s))


def compare_replicas(
    digests: list[str], hosts: list[str], step: int | None, ranks: list[int] | None = None
) -> list[Finding]:
    """H201 when the digests of one replica set are not all equal; pure, so testable without
    processes. `ranks[i]` is the global rank of `digests[i]` (default: i).

    The majority digest is the reference and every other rank is named. With no strict
    majority (two ranks, or an even split) the odd one cannot be told by vote, and no rank,
    rank 0 included, is assumed right: all are named as suspects. The rollback that follows
    repairs every rank either way, since all reload the same checkpoint.
    """
    ranks = list(range(len(digests))) if ranks is None else ranks
    counts = Counter(digests)
    if len(counts) <= 1:
        return []
    top, n_top = counts.most_common(1)[0]
    majority = n_top * 2 > len(digests)
    if majority:
        suspects = [r for r, d in zip(ranks, digests, strict=True) if d != top]
    else:
        suspects = list(ranks)

    def host(r: int) -> str:
        return hosts[r] if 0 <= r < len(hosts) else "?"

    named = ", ".join(f"rank {r} ({host(r)})" for r in suspects)
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
            where=", ".join(host(r) for r in suspects),
            data={
                "suspect_ranks": suspects,
                "suspect_hosts": [host(r) for r in suspects],
                "replica_set": ranks,
                "digests": digests,
                "majority": majority,
            },
        )
    ]


def no_replicas_finding(step: int | None, world_size: int) -> Finding:
    """H203 (info): every rank holds a different shard (plain FSDP2); nothing to compare."""
    return Finding.of(
        "H203",
        f"no two of the {world_size} ranks hold the same parameters (fully sharded): the "
        "replica check has nothing to compare and is off for this model",
        step=step,
        data={"world_size": world_size},
    )
