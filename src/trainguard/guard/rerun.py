"""Rerun to classify: recompute a suspect step from the same state and batch.

A different result points to hardware (silent data corruption, R205); the same one to the
data or the software (R206). The loop does the recomputation (it owns the model, the batch and
the RNG state); this module only compares what the two runs produced.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from trainguard.findings import Finding


def _as_array(x: Any):
    import numpy as np

    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    elif isinstance(x, dict):
        return np.concatenate([_as_array(x[k]).ravel() for k in sorted(x)])
    elif isinstance(x, list | tuple):
        return np.concatenate([_as_array(v).ravel() for v in x]) if x else np.zeros(0)
    return np.asarray(x, dtype=np.float64)


def classify_rerun(first: Any, second: Any, rtol: float = 0.0, step: int | None = None) -> Finding:
    """R205 (hardware) if a recomputation of the same step differs from the first, else R206.

    `first`/`second` are what the step produced each time: a loss, a gradient norm, tensors, or
    lists/dicts of them. NaNs in the same places count as the same result.
    """
    import numpy as np

    a, b = _as_array(first).astype(np.float64).ravel(), _as_array(second).astype(np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"rerun results differ in size: {a.shape} vs {b.shape}")
    same = bool(np.allclose(a, b, rtol=rtol, atol=0.0, equal_nan=True))
    both = np.isfinite(a) & np.isfinite(b)
    max_diff = float(np.max(np.abs(a[both] - b[both]))) if both.any() else 0.0
    data = {
        "cause": "deterministic" if same else "hardware",
        "max_abs_diff": max_diff if math.isfinite(max_diff) else None,
        "values": int(a.size),
        "rtol": rtol,
    }
    if same:
        return Finding.of(
            "R206",
            "the rerun of the step gave the same result: a data or software fault, not hardware",
            step=step,
            data=data,
        )
    return Finding.of(
        "R205",
        f"the rerun of the step differs from the first run (max abs difference {max_diff:.3g}): "
        "suspect silent data corruption on this machine",
        step=step,
        data=data,
    )


class StepRng:
    """The torch generators' states as a step began, for a rerun that must draw the same
    dropout masks: `StepRng()` at the step's start, `with rng.replay():` around the rerun (the
    generators are put back as they were after it, so the run goes on as if nothing reran)."""

    def __init__(self) -> None:
        import torch

        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        import torch

        now = StepRng()
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        try:
            yield
        finally:
            torch.set_rng_state(now.cpu)
            if now.cuda is not None:
                torch.cuda.set_rng_state_all(now.cuda)
