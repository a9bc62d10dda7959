"""`BatchSchedule`: the global batch size of each optimizer step, constant or ramped.

    BatchSchedule.constant(64)
    BatchSchedule.of([(0, 32), (100, 64), (300, 128)])  # 32 for steps 0-99, 64 for 100-299, ...

Steps count completed steps from 0, as `ElasticSampler.set_step` does: a change at step 100
applies to the 101st step. The positions of the data order a step starts at are the sum of the
sizes of the steps before it (`start`), so a ramp reads the same stream of positions as a
constant batch, cut into other lengths: every sample is still read once per epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.errors import ConfigError
from trainguard.util.strict import int_arg

_FORM = "a positive int, or [(step, size), ...] with steps rising from 0"


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
        """`value` (an int, (step, size) pairs or a BatchSchedule) checked strictly: any
        other type or value is a ConfigError naming `name` and the offending entry."""
        if isinstance(value, BatchSchedule):
            value = value.changes
        if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
            size = int_arg(name, value, low=1, fix=f"pass {_FORM}")
            return BatchSchedule.constant(size)
        if not value:
            raise ConfigError(f"{name} is an empty schedule", f"pass {_FORM}")
        changes: list[tuple[int, int]] = []
        for i, pair in enumerate(value):
            if not isinstance(pair, Sequence) or isinstance(pair, (str, bytes)) or len(pair) != 2:
                raise ConfigError(
                    f"{name}[{i}] is {pair!r:.60}, not a (step, size) pair", f"pass {_FORM}"
                )
            step = int_arg(f"{name}[{i}] step", pair[0], low=0, fix=f"pass {_FORM}")
            size = int_arg(f"{name}[{i}] size", pair[1], low=1, fix=f"pass {_FORM}")
            if (i == 0) != (step == 0) or (changes and step <= changes[-1][0]):
                raise ConfigError(
                    f"{name}[{i}] is at step {step}: the steps of a schedule must start at 0 "
                    "and rise strictly",
                    f"pass {_FORM}",
                )
            if changes and size == changes[-1][1]:
                continue  # no change: the same schedule, written longer
            changes.append((step, size))
        return BatchSchedule(tuple(changes))

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
