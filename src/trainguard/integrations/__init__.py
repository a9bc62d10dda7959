"""Thin adapters that plug `Guard` into other trainers (optional extras).

- `trainguard.integrations.hf.TrainguardCallback`: a Hugging Face `transformers.TrainerCallback`.
- `trainguard.integrations.lightning.TrainguardLightningCallback`: a Lightning `Callback`.
Each module imports its framework on import and says how to install it when it is missing.
"""

from __future__ import annotations

from typing import Any


def clear_grads(model: Any) -> None:
    """Drop every gradient so that the framework's unconditional optimizer step changes nothing
    (torch optimizers skip parameters whose `.grad` is None: no update, no weight decay, no
    moment update)."""
    for p in model.parameters():
        p.grad = None
