"""`ElasticSampler`: the elastic data order of `trainguard run` as a torch `Sampler` for any
map-style dataset.

    sampler = ElasticSampler(len(dataset), global_batch_size=64, seed=0, max_steps=1000,
                             micro_batch_size=8)
    loader = DataLoader(dataset, sampler=sampler, batch_size=sampler.micro_batch_size)
    sampler.set_step(checkpointer.load_latest(state) or 0)
    for micro_batch in loader: ...   # sampler.accum_steps micro-batches make one step

The global batch of step s (counted from 0) is a pure function of (seed, s, recorded skips):
the order is `data.order.ElasticOrder`, read as one stream of positions across epochs, in
blocks of `global_batch_size` positions (a block may straddle an epoch boundary). Step s reads
the s-th block that no rollback marked bad: exactly the positions `trainguard run` reads
(it advances its position by one global batch per step and jumps over skipped ranges). Since
nothing depends on the rank count, a run saved with N processes and resumed with M reads the
same global batches; each rank takes its contiguous slice (`order.rank_slice`) and splits it
into `accum_steps` consecutive micro-batches.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from trainguard.config.schema import SEED_MAX
from trainguard.data.order import ElasticOrder, batch_hash, rank_slice
from trainguard.errors import BadInputError, ConfigError
from trainguard.util.strict import int_arg, optional_int_arg

STATE_VERSION = 1

POSITION_MAX = 2**63 - 1  # sample ids and positions are int64


def _step_arg(step: object) -> int:
    """A step number, checked at the boundary: an int >= 0 (1.7 is not step 1)."""
    return int_arg("step", step, low=0, fix="steps count from 0 in whole numbers")


def _default_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """torch.distributed's rank and world size when it is initialised, else 0 and 1."""
    import torch.distributed as dist

    live = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if live else 1
    if rank is None:
        rank = dist.get_rank() if live else 0
    return int(rank), int(world_size)


class ElasticSampler(Sampler[int]):
    """This rank's sample ids of every global batch, step after step, from `set_step`'s step."""

    def __init__(
        self,
        num_samples: int,
        *,
        global_batch_size: int,
        seed: int,
        rank: int | None = None,
        world_size: int | None = None,
        max_steps: int | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        # Types first, at the public boundary: a float is refused (8.5 is no batch size), not
        # truncated; a bool is no count.
        num_samples = int_arg("num_samples", num_samples, fix="pass len(dataset)")
        global_batch_size = int_arg(
            "global_batch_size",
            global_batch_size,
            low=1,
            fix="pass the number of samples one optimizer step consumes over all ranks",
        )
        seed = int_arg("seed", seed, low=0, high=SEED_MAX, fix=f"pass a seed in 0..{SEED_MAX}")
        rank = optional_int_arg("rank", rank)
        world_size = optional_int_arg("world_size", world_size)
        max_steps = optional_int_arg("max_steps", max_steps)
        micro_batch_size = optional_int_arg("micro_batch_size", micro_batch_size)
        if num_samples < global_batch_size:
            raise BadInputError(
                f"the dataset has {num_samples} samples, fewer than one global batch of "
                f"{global_batch_size}",
                "use a larger dataset or a smaller global_batch_size",
            )
        if max_steps is not None and max_steps < 0:
            raise BadInputError(f"max_steps must be >= 0 or None, got {max_steps}")
        self.rank, self.world_size = _default_rank_world(rank, world_size)
        self.order = ElasticOrder(num_samples, seed)
        self.global_batch_size = int(global_batch_size)
        self.max_steps = max_steps
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise BadInputError(
                f"rank {self.rank} is outside world size {self.world_size}",
                "pass 0 <= rank < world_size (or leave both to torch.distributed)",
            )
        if self.global_batch_size % self.world_size:
            raise BadInputError(
                f"global_batch_size={self.global_batch_size} does not split evenly over "
                f"{self.world_size} ranks",
                f"use a global batch size that is a multiple of {self.world_size}, or a rank "
                f"count that divides {self.global_batch_size}",
            )
        self.local_batch_size = self.global_batch_size // self.world_size
        self.micro_batch_size = (
            self.local_batch_size if micro_batch_size is None else int(micro_batch_size)
        )
        if self.micro_batch_size < 1 or self.local_batch_size % self.micro_batch_size:
            raise BadInputError(
                f"micro_batch_size={micro_batch_size} does not divide this rank's "
                f"{self.local_batch_size} samples per step (global batch "
                f"{self.global_batch_size} over {self.world_size} ranks)",
                f"use a micro_batch_size that divides {self.local_batch_size}",
            )
        self._skipped: list[int] = []  # sorted block indices (block b = positions [bG, (b+1)G))
        self._start = 0

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        return self.order.num_samples

    @property
    def seed(self) -> int:
        return self.order.seed

    @property
    def accum_steps(self) -> int:
        """Micro-batches per optimizer step on this rank (gradient accumulation)."""
        return self.local_batch_size // self.micro_batch_size

    # -- the pure function of (seed, step, skips) ------------------------------------------------
    def block(self, step: int) -> int:
        """The index of the block of `global_batch_size` positions that step `step` reads:
        the step-th block that is not skipped."""
        b = _step_arg(step)
        for skipped in self._skipped:  # sorted: each skipped block at or before b pushes b on
            if skipped > b:
                break
            b += 1
        if (b + 1) * self.global_batch_size > POSITION_MAX:
            last = POSITION_MAX // self.global_batch_size - 1 - len(self._skipped)
            raise ConfigError(
                f"step {step} is past the last step the order can address ({last}: positions "
                f"are int64, {self.global_batch_size} per step)",
                "pass a step number a run can reach",
            )
        return b

    def position(self, step: int) -> int:
        """The global position (samples since the start, over epochs) step `step` starts at."""
        return self.block(step) * self.global_batch_size

    def batch_ids(self, step: int) -> np.ndarray:
        """The global batch of step `step`: `global_batch_size` sample ids (int64), in order."""
        return self.order.sample_ids(self.position(step), self.global_batch_size)

    def rank_ids(self, step: int) -> np.ndarray:
        """This rank's contiguous slice of step `step`'s global batch."""
        return rank_slice(self.batch_ids(step), self.rank, self.world_size)

    def micro_batch_ids(self, step: int) -> list[np.ndarray]:
        """This rank's slice of step `step` as `accum_steps` consecutive micro-batches."""
        mine = self.rank_ids(step)
        m = self.micro_batch_size
        return [mine[i : i + m] for i in range(0, len(mine), m)]

    def batch_hash(self, step: int) -> str:
        """The hash `trainguard run` logs for the step (`batch_hash` of its metrics row)."""
        return batch_hash(self.batch_ids(step))

    # -- rollback ------------------------------------------------------------------------------
    def skip(self, steps: Iterable[int]) -> list[list[int]]:
        """Record that the samples of `steps` (as they are read now) must never be read again.

        Every later step moves on by position: the step that would have read a skipped block
        reads the next unskipped one, as `trainguard run` jumps over skipped ranges. Skip only
        steps not yet committed (at or after the step you resume from, as `Guard.rollback`
        does): skipping an earlier step would move every later step's batch. Returns the
        position ranges [start, end) recorded.
        """
        blocks = sorted({self.block(s) for s in steps})  # all read before any is added
        for b in blocks:
            i = bisect.bisect_left(self._skipped, b)
            if i == len(self._skipped) or self._skipped[i] != b:
                self._skipped.insert(i, b)
        return [[b * self.global_batch_size, (b + 1) * self.global_batch_size] for b in blocks]

    @property
    def skipped_positions(self) -> list[list[int]]:
        """The recorded skips as position ranges [start, end), `trainguard run`'s format."""
        g = self.global_batch_size
        return [[b * g, (b + 1) * g] for b in self._skipped]

    # -- iteration -----------------------------------------------------------------------------
    def set_step(self, step: int) -> None:
        """The next `iter()` starts at step `step` (the number of completed steps)."""
        self._start = _step_arg(step)

    def __iter__(self) -> Iterator[int]:
        step = self._start  # fixed now: later set_step calls affect only later iterators
        while self.max_steps is None or step < self.max_steps:
            yield from self.rank_ids(step).tolist()
            step += 1

    def __len__(self) -> int:
        """The sample ids the next iterator yields on this rank: from the set step to
        `max_steps`. A sampler without `max_steps` never ends and has no length."""
        if self.max_steps is None:
            raise TypeError("an ElasticSampler without max_steps is endless and has no len()")
        return max(0, self.max_steps - self._start) * self.local_batch_size

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "global_batch_size": self.global_batch_size,
            "skipped_positions": self.skipped_positions,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt a saved order: its seed and skips. The dataset size and the global batch size
        must be this sampler's (a different value would read other samples); the rank count
        may differ."""
        fix = "load the state an ElasticSampler saved"
        try:
            # Integers as saved: a float or a bool here is a damaged or foreign state, and
            # int() would truncate it into another order.
            seed = int_arg("state['seed']", state["seed"], low=0, high=SEED_MAX, fix=fix)
            num_samples = int_arg("state['num_samples']", state["num_samples"], fix=fix)
            global_batch = int_arg("state['global_batch_size']", state["global_batch_size"])
            ranges = [
                (
                    int_arg("a skipped position", a, low=0, high=POSITION_MAX, fix=fix),
                    int_arg("a skipped position", b, low=0, high=POSITION_MAX, fix=fix),
                )
                for a, b in state.get("skipped_positions", [])
            ]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(
                f"load_state_dict(state): state {state!r:.200} is not an ElasticSampler "
                "state_dict()",
                fix,
            ) from None
        if num_samples != self.num_samples:
            raise BadInputError(
                f"the saved sampler state is for a dataset of {num_samples} samples, this "
                f"sampler's has {self.num_samples}",
                "resume with the dataset the run was started with",
            )
        if global_batch != self.global_batch_size:
            raise BadInputError(
                f"the saved sampler state has global_batch_size={global_batch}, this sampler "
                f"has global_batch_size={self.global_batch_size}",
                f"resume with global_batch_size={global_batch} (per-rank batch x ranks x "
                "accumulation), whatever the rank count",
            )
        g = self.global_batch_size
        bad = [r for r in ranges if r[0] % g or r[1] - r[0] != g]
        if bad:
            raise BadInputError(
                f"skipped position ranges {bad} are not whole global batches of {g}",
                "load the state an ElasticSampler saved",
            )
        self.order = ElasticOrder(self.num_samples, seed)
        self._skipped = sorted({a // g for a, _ in ranges})
