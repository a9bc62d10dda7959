"""`Loop`: what `trainguard run`'s loop is made of, built by `train/compose.py` and handed to
the spine (`spine.py`), the device path (`device_steps.py`), the actions (`actions.py`) and the
saves (`saving.py`). Its own module, so that those four share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.checkpoint.results import AsyncSave
from trainguard.data.sampler import ElasticSampler
from trainguard.guard.core import Guard
from trainguard.train.callback import Callbacks, RunContext
from trainguard.train.compute import StepMath


@dataclass
class Loop:
    """What the loop is made of (built by `train/compose.py`)."""

    ctx: RunContext
    math: StepMath
    sampler: ElasticSampler
    guard: Guard
    checkpointer: Checkpointer
    callbacks: Callbacks
    state: dict[str, Any]
    """What every checkpoint holds and a rollback restores (train/run_state.py)."""
    checkpoint_meta: dict[str, Any] = field(default_factory=dict)
    """Written into each checkpoint's manifest (the data's identity, for D104 on resume)."""
    writing: list[tuple[int, AsyncSave]] = field(default_factory=list)
    """The checkpoints queued or being written in the background (`checkpoint.async_save`),
    oldest first: each one's step and the Checkpointer's handle."""

    def step_tokens(self, step: int) -> int:
        """Tokens step `step` (0-based) reads (its global batch, which a ramp sizes)."""
        return self.sampler.global_batch_size_at(step) * self.ctx.recipe.data.seq_len
