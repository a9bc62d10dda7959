"""Logits out of whatever a model's forward returns: the one reader the checks, the precision
audit and the shadow run share."""

from __future__ import annotations

from typing import Any

import torch

from trainguard.errors import BadInputError


class ModelOutputError(BadInputError):
    """A model's forward returned nothing that holds a logits tensor."""


def extract_logits(out: Any) -> torch.Tensor:
    """Logits from a tensor, a tuple/list (first item), a dict or an object with `.logits`."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if isinstance(out, dict) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"]
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise ModelOutputError(
        f"the model returned {type(out).__name__}, which holds no logits tensor",
        "return logits [B, T, V], a tuple whose first item is the logits, or an object with "
        "a `.logits` attribute",
    )
