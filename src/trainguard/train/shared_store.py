"""The checkpoint store as the ranks of one job see it: rank 0 writes, all ranks load the step
rank 0 chose.

Rank 0 alone picks the checkpoint (the newest valid one, falling back past damaged ones) and
broadcasts its step; the other ranks load exactly that step. Without the broadcast, a rank
that listed the store a moment earlier or later, or whose download of the newest step failed,
would resume from a different step than its peers and the replicas would silently diverge.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.checkpoint.failures import describe
from trainguard.checkpoint.fsurl import default_cache_dir
from trainguard.checkpoint.results import LoadedCheckpoint
from trainguard.checkpoint.store import CheckpointStore
from trainguard.config.schema import Recipe
from trainguard.errors import CorruptError, StorageError, TrainguardError
from trainguard.findings import Finding, has_errors
from trainguard.train.distributed import Dist
from trainguard.util.paths import is_remote


class SharedStore:
    """Wraps a `CheckpointStore`; `load_latest` is collective, everything else passes through."""

    def __init__(self, store: CheckpointStore, dist: Dist) -> None:
        self.store = store
        self.dist = dist

    def load_latest(
        self, usable: Callable[[LoadedCheckpoint], list[Finding]] | None = None
    ) -> LoadedCheckpoint | None:
        if not self.dist.active:
            return self.store.load_latest(usable)
        loaded = self.store.load_latest(usable) if self.dist.world.rank == 0 else None
        # Rank 0's choice, and its C107 when nothing is usable: every rank refuses alike.
        refusal = [f.to_dict() for f in self.store.last_findings if f.code == "C107"]
        step, refusal = self.dist.broadcast_object(
            (loaded.step if loaded is not None else None, refusal)
        )
        if self.dist.world.rank == 0:
            return loaded
        if step is None:
            self.store.last_findings = [Finding.from_dict(d) for d in refusal]
            return None
        loaded = self.store.load(step)
        problems = usable(loaded) if usable is not None else []
        if has_errors(problems):  # the bytes rank 0 accepted: this should never happen
            raise CorruptError(
                f"rank {self.dist.world.rank} cannot load checkpoint step {step} that rank 0 "
                "chose: " + "; ".join(f.message for f in problems),
                "check that every rank sees the same checkpoint storage",
            )
        loaded.findings += problems
        return loaded

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def checkpoint_root(recipe: Recipe, run_dir: Path) -> str:
    return recipe.checkpoint.dir or str(run_dir / "checkpoints")


def open_store(recipe: Recipe, run_dir: Path, dist: Dist) -> SharedStore:
    """The run's store: a path or any fsspec URL (`checkpoint.dir`), with its storage options."""
    root = checkpoint_root(recipe, run_dir)
    cache_dir = None
    if is_remote(root) and dist.active:
        # Local ranks share a machine: each gets its own download cache, so two ranks never
        # fetch into the same folder at once.
        cache_dir = str(default_cache_dir(root) / f"rank{dist.world.rank}")
    store = CheckpointStore(
        root,
        keep=recipe.checkpoint.keep,
        rank=dist.world.rank,
        world_size=dist.world.size,
        storage_options=getattr(recipe.checkpoint, "storage_options", None) or None,
        cache_dir=cache_dir,
    )
    return SharedStore(store, dist)


def probe_store(store: SharedStore, root: str) -> None:
    """List the store once, before data preparation: a bucket without credentials is bad input
    (exit 2), an endpoint that does not answer a StorageError naming the root, found in
    seconds rather than after the data is prepared and the model built."""
    try:
        store.steps()
    except TrainguardError:
        raise
    except Exception as e:
        raise StorageError(
            f"cannot list the checkpoint store {root}: {describe(e)}",
            "check checkpoint.dir, its endpoint and the network (`trainguard doctor` tests the "
            "store), or use a local checkpoint.dir",
        ) from None
