"""What a framework adapter keeps to rerun an optimizer step on the same batch (R205/R206).

The guard asks for a rerun of a step whose update it refused (`Decision.rerun`); `Guard.settle`
calls the loop's `rerun(step)`. Inside a framework (the Trainer adapters) the loop is not ours,
so the adapter records each step's micro-batches as the framework hands them over, with the
random generators' state at the step's start (dropout draws the same masks), and replays them
through the framework's own forward and backward. The last two steps are kept: on the device
path the decision, and so the rerun, comes one step late.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.guard.rerun import StepRng


def _shallow(x: Any) -> Any:
    """A batch's container copied (a loss function that pops a key from its inputs must find it
    again); its tensors, and anything else (the model), shared."""
    return copy.copy(x) if isinstance(x, Mapping | list) else x


@dataclass
class _Step:
    rng: StepRng
    micro: list[tuple[Any, ...]] = field(default_factory=list)


class StepInputs:
    """`record(step, *args)` per micro-batch; `rerun(step)` replays them with `compute(*args)`
    (one micro-batch's forward and backward, returning its loss), the gradient all-reduce held
    back until the last one by `no_sync()` when given (DDP: one reduction, as the step had)."""

    def __init__(
        self,
        compute: Callable[..., Any],
        no_sync: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        grad_norm: Callable[[], Any] | None = None,
    ) -> None:
        self.compute, self.no_sync, self.grad_norm = compute, no_sync, grad_norm
        self.steps: dict[int, _Step] = {}

    def record(self, step: int, *args: Any) -> None:
        if step not in self.steps:
            self.steps = {s: v for s, v in self.steps.items() if s == step - 1}
            self.steps[step] = _Step(StepRng())
        self.steps[step].micro.append(tuple(_shallow(a) for a in args))

    def clear(self) -> None:
        self.steps = {}

    def rerun(self, step: int) -> tuple[Any, Any]:
        """Step `step` computed again: (its loss, its gradient norm or None)."""
        rec = self.steps[step]
        total = None
        with rec.rng.replay():
            for i, args in enumerate(rec.micro):
                last = i == len(rec.micro) - 1
                hold = self.no_sync is not None and not last
                with self.no_sync() if hold else contextlib.nullcontext():
                    loss = self.compute(*(_shallow(a) for a in args)).detach()
                total = loss if total is None else total + loss
        return total, self.grad_norm() if self.grad_norm is not None else None
