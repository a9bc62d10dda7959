"""The rules of a global batch-size schedule, written once: `BatchSchedule.of` (the sampler's,
data/batch_schedule.py) and the recipe's `train.batch_ramp` (config/schema.py) both check
their pairs here, so a ramp the recipe accepts is one the sampler accepts, with the same words.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainguard.errors import ConfigError
from trainguard.util.strict import int_arg

FORM = "a positive int, or [(step, size), ...] with steps rising from 0"


def schedule_changes(value: Any, name: str, form: str = FORM) -> tuple[tuple[int, int], ...]:
    """`value` (an int, or (step, size) pairs) as the schedule's changes: the first at step 0,
    steps strictly rising, sizes positive, a pair that repeats the size before it dropped.
    Anything else is a ConfigError naming `name`, the offending entry and `form`."""
    fix = f"pass {form}"
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        return ((0, int_arg(name, value, low=1, fix=fix)),)
    if not value:
        raise ConfigError(f"{name} is empty: no (step, size) pair", fix)
    changes: list[tuple[int, int]] = []
    for i, pair in enumerate(value):
        if not isinstance(pair, Sequence) or isinstance(pair, (str, bytes)) or len(pair) != 2:
            raise ConfigError(f"{name}[{i}] is {pair!r:.60}, not a (step, size) pair", fix)
        step = int_arg(f"{name}[{i}] step", pair[0], low=0, fix=fix)
        size = int_arg(f"{name}[{i}] size", pair[1], low=1, fix=fix)
        if (i == 0) != (step == 0) or (changes and step <= changes[-1][0]):
            raise ConfigError(
                f"{name}[{i}] is at step {step}: the steps of a schedule must start at 0 and "
                "rise strictly",
                fix,
            )
        if changes and size == changes[-1][1]:
            continue  # no change: the same schedule, written longer
        changes.append((step, size))
    return tuple(changes)
