"""Learning-rate schedule: linear warm-up, then cosine decay to lr * min_lr_ratio."""

from __future__ import annotations

import math


def lr_at(
    step: int, peak_lr: float, warmup_steps: int, max_steps: int, min_lr_ratio: float
) -> float:
    """The learning rate for optimizer step `step` (0-based).

    A pure function of the step, so a resumed run needs no scheduler state.
    """
    min_lr = peak_lr * min_lr_ratio
    if warmup_steps > 0 and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
