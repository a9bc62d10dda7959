"""`BatchSchedule`: the global batch size of each optimizer step, constant or ramped.

    BatchSchedule.constant(64)
    BatchSchedule.of([(0, 32), (100, 64), (300, 128)])  # 32 for steps 0-99, 64 for 100-299, ...

Steps count from 0, as `ElasticSampler.set_step` and the run record's step rows do: a change
at step 100 applies from step 100, the 101st step. The positions of the data order a step
starts at are the sum of the sizes of the steps before it (`start`), so a ramp reads the same
stream of positions as a constant batch, cut into other lengths: every sample is still read
once per epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainguard.config.batch_ramp import schedule_changes


@dataclass(frozen=True)
class BatchSchedule:
    """`changes`: (step, size) pairs, the first at step 0, steps strictly rising; a size
    holds from its step until the next change (the last to the end of the run)."""

    changes: tuple[tuple[int, int], ...]

    @staticmethod
    def constant(size: int) -> BatchSchedule:
        return BatchSchedule(((0, size),))

    @staticmethod
    def of(value: Any, name: str = "global_batch_size") -> BatchSchedule:
        """`value` (an int, (step, size) pairs or a BatchSchedule) checked strictly
        (`config.batch_ramp.schedule_changes`): any other type or value is a ConfigError
        naming `name` and the offending entry."""
        if isinstance(value, BatchSchedule):
            value = value.changes
        return BatchSchedule(schedule_changes(value, name))

    # -- reading ---------------------------------------------------------------------------
    @property
    def is_constant(self) -> bool:
        return len(self.changes) == 1

    @property
    def sizes(self) -> list[int]:
        return [size for _, size in self.changes]

    def size(self, step: int) -> int:
        """The global batch size of step `step` (counted from 0)."""
        current = self.changes[0][1]
        for at, size in self.changes:
            if at > step:
                break
            current = size
        return current

    def start(self, step: int) -> int:
        """Samples read by steps 0..step-1: the position step `step` starts at (no skips)."""
        total, (at, size) = 0, self.changes[0]
        for next_at, next_size in self.changes[1:]:
            if next_at >= step:
                break
            total += (next_at - at) * size
            at, size = next_at, next_size
        return total + (step - at) * size

    def first_difference(self, other: BatchSchedule) -> int | None:
        """The first step whose size differs between the two schedules; None if none does."""
        if self == other:
            return None
        steps = sorted({at for at, _ in self.changes} | {at for at, _ in other.changes})
        return next(s for s in steps if self.size(s) != other.size(s))

    def to_list(self) -> list[list[int]]:
        """The JSON form a state_dict holds: [[step, size], ...]."""
        return [[at, size] for at, size in self.changes]

    def __str__(self) -> str:
        if self.is_constant:
            return str(self.changes[0][1])
        return "[" + ", ".join(f"({at}, {size})" for at, size in self.changes) + "]"
