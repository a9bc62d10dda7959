"""`ElasticSampler`: the elastic data order of `trainguard run` as a torch `Sampler` for any
map-style dataset.

    sampler = ElasticSampler(len(dataset), global_batch_size=64, seed=0, max_steps=1000,
                             micro_batch_size=8)
    loader = DataLoader(dataset, sampler=sampler, batch_size=sampler.micro_batch_size)
    sampler.set_step(checkpointer.load_latest(state) or 0)
    for micro_batch in loader: ...   # sampler.accum_steps micro-batches make one step

The global batch of step s (counted from 0) is a pure function of (seed, s, recorded skips):
the order is `data.order.ElasticOrder`, read as one stream of positions across epochs. Step s
reads the next global-batch-size positions (its size from the batch schedule: a constant, or
a ramp such as `[(0, 32), (100, 64)]`, `data/batch_schedule.py`) after those of steps 0..s-1,
counted over the positions no rollback skipped; a batch may straddle an epoch boundary. So a
ramp cuts the same stream into other lengths: every sample is read once per epoch, whatever
the sizes. These are exactly the positions `trainguard run` reads (it advances its position
by one global batch per step and jumps over skipped ranges). Since nothing depends on the rank
count, a run saved with N processes and resumed with M reads the same global batches; each
rank takes its contiguous slice (`order.rank_slice`) and splits it into `accum_steps_at(s)`
consecutive micro-batches (a ramp accumulates more micro-batches as the batch grows).
"""

from __future__ import annotations

import bisect
import copy
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from trainguard.config.schema import SEED_MAX
from trainguard.data.batch_schedule import BatchSchedule
from trainguard.data.order import ElasticOrder, batch_hash, rank_slice
from trainguard.errors import BadInputError, ConfigError
from trainguard.util.strict import int_arg, optional_int_arg

STATE_VERSION = 1
RAMP_STATE_VERSION = 2  # a schedule of sizes instead of global_batch_size

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
    """This rank's sample ids of every global batch, step after step, from `set_step`'s step.

    `global_batch_size` is an int, or a schedule of sizes (`BatchSchedule`, or (step, size)
    pairs such as `[(0, 32), (100, 64), (300, 128)]`: a batch-size ramp)."""

    def __init__(
        self,
        num_samples: int,
        *,
        global_batch_size: int | BatchSchedule | Sequence[tuple[int, int]],
        seed: int,
        rank: int | None = None,
        world_size: int | None = None,
        max_steps: int | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        # Types first, at the public boundary: a float is refused (8.5 is no batch size), not
        # truncated; a bool is no count.
        num_samples = int_arg("num_samples", num_samples, fix="pass len(dataset)")
        schedule = BatchSchedule.of(global_batch_size, "global_batch_size")
        seed = int_arg("seed", seed, low=0, high=SEED_MAX, fix=f"pass a seed in 0..{SEED_MAX}")
        rank = optional_int_arg("rank", rank)
        world_size = optional_int_arg("world_size", world_size)
        max_steps = optional_int_arg("max_steps", max_steps)
        micro_batch_size = optional_int_arg("micro_batch_size", micro_batch_size)
        largest = max(schedule.sizes)
        if num_samples < largest:
            raise BadInputError(
                f"the dataset has {num_samples} samples, fewer than one global batch of {largest}",
                "use a larger dataset or a smaller global_batch_size",
            )
        if max_steps is not None and max_steps < 0:
            raise BadInputError(f"max_steps must be >= 0 or None, got {max_steps}")
        self.rank, self.world_size = _default_rank_world(rank, world_size)
        self.order = ElasticOrder(num_samples, seed)
        self.schedule = schedule
        self.max_steps = max_steps
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise BadInputError(
                f"rank {self.rank} is outside world size {self.world_size}",
                "pass 0 <= rank < world_size (or leave both to torch.distributed)",
            )
        # The whole schedule is checked now, not when the ramp reaches a size that cannot be
        # split: a run must not stop at step 300 for what was wrong at its start.
        for at, size in schedule.changes:
            if size % self.world_size:
                where = "" if schedule.is_constant else f" (from step {at})"
                raise BadInputError(
                    f"global_batch_size={size}{where} does not split evenly over "
                    f"{self.world_size} ranks",
                    f"use global batch sizes that are multiples of {self.world_size}, or a rank "
                    f"count that divides {size}",
                )
        locals_ = [size // self.world_size for size in schedule.sizes]
        self.micro_batch_size = (
            math.gcd(*locals_) if micro_batch_size is None else int(micro_batch_size)
        )
        for (at, size), local in zip(schedule.changes, locals_, strict=True):
            if self.micro_batch_size < 1 or local % self.micro_batch_size:
                where = "" if schedule.is_constant else f" from step {at}"
                raise BadInputError(
                    f"micro_batch_size={micro_batch_size} does not divide this rank's "
                    f"{local} samples per step{where} (global batch {size} over "
                    f"{self.world_size} ranks)",
                    f"use a micro_batch_size that divides {math.gcd(*locals_)}",
                )
        # Skipped position ranges [start, end), sorted and disjoint: never read again.
        self._skipped: list[tuple[int, int]] = []
        self._start = 0
        # Where a loaded state's schedule first differs from this one (set_step checks it).
        self._saved: tuple[BatchSchedule, int] | None = None

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        return self.order.num_samples

    @property
    def seed(self) -> int:
        return self.order.seed

    def global_batch_size_at(self, step: int) -> int:
        """Samples step `step` reads over all ranks."""
        return self.schedule.size(_step_arg(step))

    def local_batch_size_at(self, step: int) -> int:
        """Samples step `step` reads on this rank."""
        return self.global_batch_size_at(step) // self.world_size

    def accum_steps_at(self, step: int) -> int:
        """Micro-batches of step `step` on this rank (gradient accumulation): a ramp keeps the
        micro-batch and accumulates more of them as the batch grows."""
        return self.local_batch_size_at(step) // self.micro_batch_size

    # The sizes of the step `set_step` set (for a constant schedule, the constant).
    @property
    def global_batch_size(self) -> int:
        return self.global_batch_size_at(self._start)

    @property
    def local_batch_size(self) -> int:
        return self.local_batch_size_at(self._start)

    @property
    def accum_steps(self) -> int:
        """Micro-batches per optimizer step on this rank (gradient accumulation), at the step
        `set_step` set; `accum_steps_at(step)` for any step of a ramp."""
        return self.accum_steps_at(self._start)

    # -- the pure function of (seed, step, skips) ------------------------------------------------
    def _pieces(self, step: int) -> list[tuple[int, int]]:
        """The (position, count) runs step `step` reads: the positions from the schedule's
        start of the step on, counted over the positions that no skip removed."""
        s = _step_arg(step)
        p, count = self.schedule.start(s), self.schedule.size(s)
        ranges = iter(self._skipped)
        pending = None
        for a, b in ranges:  # each skipped range at or before p pushes p on
            if a > p:
                pending = (a, b)
                break
            p += b - a
        pieces: list[tuple[int, int]] = []
        while pending is not None and pending[0] < p + count:  # a skip inside the batch
            a, b = pending
            if a > p:
                pieces.append((p, a - p))
                count -= a - p
            p = b
            pending = next(ranges, None)
        pieces.append((p, count))
        if p + count > POSITION_MAX:
            raise ConfigError(
                f"step {step} is past the last step the order can address (positions are "
                f"int64; this step would end at position {p + count})",
                "pass a step number a run can reach",
            )
        return pieces

    def position(self, step: int) -> int:
        """The global position (samples since the start, over epochs) step `step` starts at."""
        return self._pieces(step)[0][0]

    def batch_ids(self, step: int) -> np.ndarray:
        """The global batch of step `step`: its global batch size of sample ids (int64)."""
        parts = [self.order.sample_ids(p, n) for p, n in self._pieces(step)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def rank_ids(self, step: int) -> np.ndarray:
        """This rank's contiguous slice of step `step`'s global batch."""
        return rank_slice(self.batch_ids(step), self.rank, self.world_size)

    def micro_batch_ids(self, step: int) -> list[np.ndarray]:
        """This rank's slice of step `step` as `accum_steps_at(step)` consecutive
        micro-batches."""
        mine = self.rank_ids(step)
        m = self.micro_batch_size
        return [mine[i : i + m] for i in range(0, len(mine), m)]

    def batch_hash(self, step: int) -> str:
        """The hash `trainguard run` logs for the step (`batch_hash` of its metrics row)."""
        return batch_hash(self.batch_ids(step))

    # -- rollback ------------------------------------------------------------------------------
    def skip(self, steps: Iterable[int]) -> list[list[int]]:
        """Record that the samples of `steps` (as they are read now) must never be read again.

        Every later step moves on by position: the step that would have read a skipped range
        reads the next unskipped positions, as `trainguard run` jumps over skipped ranges. Skip
        only steps not yet committed (at or after the step you resume from, as `Guard.rollback`
        does): skipping an earlier step would move every later step's batch. Returns the
        position ranges [start, end) recorded.
        """
        # All read before any is added.
        found = sorted({(p, p + n) for s in steps for p, n in self._pieces(s)})
        for r in found:
            i = bisect.bisect_left(self._skipped, r)
            if i == len(self._skipped) or self._skipped[i] != r:
                self._skipped.insert(i, r)
        return [list(r) for r in found]

    @property
    def skipped_positions(self) -> list[list[int]]:
        """The recorded skips as position ranges [start, end), `trainguard run`'s format."""
        return [list(r) for r in self._skipped]

    # -- iteration -----------------------------------------------------------------------------
    def set_step(self, step: int) -> None:
        """The next `iter()` starts at step `step` (the number of completed steps).

        After `load_state_dict`, the steps before `step` must have had this sampler's batch
        sizes in the saved schedule: otherwise the positions already read are not the ones
        this schedule would have read, and a refusal names the first step that differs."""
        step = _step_arg(step)
        if self._saved is not None and self._saved[1] < step:
            saved, at = self._saved
            raise BadInputError(
                f"the saved sampler state's batch schedule {saved} and this sampler's "
                f"{self.schedule} disagree at step {at} ({saved.size(at)} vs "
                f"{self.schedule.size(at)} samples), before the resume step {step}",
                f"resume with a schedule that has the saved sizes up to step {step} (change "
                "only sizes from the resume step on), whatever the rank count",
            )
        self._start = step

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
        if self.max_steps <= self._start:
            return 0
        total = self.schedule.start(self.max_steps) - self.schedule.start(self._start)
        return total // self.world_size

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "version": STATE_VERSION if self.schedule.is_constant else RAMP_STATE_VERSION,
            "seed": self.seed,
            "num_samples": self.num_samples,
        }
        # A constant schedule is saved as before: an older release loads it.
        if self.schedule.is_constant:
            state["global_batch_size"] = self.schedule.sizes[0]
        else:
            state["batch_schedule"] = self.schedule.to_list()
        state["skipped_positions"] = self.skipped_positions
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt a saved order: its seed and skips. The dataset size must be this sampler's
        and the saved batch schedule must agree with this one before the step `set_step`
        resumes from (a different past would have read other samples); the rank count may
        differ."""
        fix = "load the state an ElasticSampler saved"
        try:
            # Integers as saved: a float or a bool here is a damaged or foreign state, and
            # int() would truncate it into another order.
            seed = int_arg("state['seed']", state["seed"], low=0, high=SEED_MAX, fix=fix)
            num_samples = int_arg("state['num_samples']", state["num_samples"], fix=fix)
            if "batch_schedule" in state:
                saved = BatchSchedule.of(state["batch_schedule"], "state['batch_schedule']")
            else:  # a constant schedule, or a state from before schedules
                saved = BatchSchedule.of(state["global_batch_size"], "state['global_batch_size']")
            ranges = sorted(
                {
                    (
                        int_arg("a skipped position", a, low=0, high=POSITION_MAX, fix=fix),
                        int_arg("a skipped position", b, low=0, high=POSITION_MAX, fix=fix),
                    )
                    for a, b in state.get("skipped_positions", [])
                }
            )
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
        if saved.is_constant and self.schedule.is_constant and saved != self.schedule:
            g, mine = saved.sizes[0], self.schedule.sizes[0]
            raise BadInputError(
                f"the saved sampler state has global_batch_size={g}, this sampler "
                f"has global_batch_size={mine}",
                f"resume with global_batch_size={g} (per-rank batch x ranks x "
                f"accumulation), whatever the rank count, or a schedule that starts with "
                f"(0, {g}) and changes from the resume step on",
            )
        if saved.is_constant:
            g = saved.sizes[0]
            bad = [list(r) for r in ranges if r[0] % g or r[1] - r[0] != g]
            if bad:
                raise BadInputError(
                    f"skipped position ranges {bad} are not whole global batches of {g}",
                    fix,
                )
        overlap = [
            list(r) for r, q in zip(ranges, ranges[1:], strict=False) if not r[0] < r[1] <= q[0]
        ]
        if overlap or (ranges and ranges[-1][0] >= ranges[-1][1]):
            raise BadInputError(
                f"skipped position ranges {overlap or [list(ranges[-1])]} are empty or overlap",
                fix,
            )
        differs = saved.first_difference(self.schedule)
        self.order = ElasticOrder(self.num_samples, seed)
        self._skipped = ranges
        self._saved = None if differs is None else (saved, differs)

    def state_problem(self, state: Any) -> str | None:
        """Why `state` would not load into this sampler, found on a scratch copy (nothing of
        this one changes): a Checkpointer passes over a step that does not fit before it loads
        anything (checkpoint/fit.py)."""
        try:
            copy.copy(self).load_state_dict(state)
        except (BadInputError, ConfigError) as e:
            return e.message
        return None
