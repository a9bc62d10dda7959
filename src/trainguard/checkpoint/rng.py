"""Every random number generator a training step draws from, captured and restored per rank.

A bitwise resume needs the exact generator states of each rank: torch's CPU generator
(dropout, init, sampling on the CPU), the current CUDA device's generator, Python's `random`
and numpy's global generator. Each rank's states are saved under its rank.

A resume on MORE ranks than were saved has no states for the new ranks. They are derived, so
the same checkpoint resumed on the same number of ranks always gives the same streams:
rank r gets seed xxh64("trainguard-rng:{s0}:{step}:{r}") where s0 is rank 0's
`torch.initial_seed()` at save time (the seed the run set with `torch.manual_seed`), and that
seed goes to `torch.manual_seed` (CPU and every CUDA device), `random.seed` and
`np.random.seed` (its low 32 bits). Ranks below the saved world size get their own saved
states back; on FEWER ranks the states of the missing ranks are not used.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import numpy.random  # noqa: F401  numpy loads it on first use: 6 ms inside the first save's stall
import torch

from trainguard.util.hashing import stable_u64


def capture_rng() -> dict[str, Any]:
    """This process's generator states, as plain data and tensors (see codec.py)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "initial_seed": int(torch.initial_seed()),
        "torch_cpu": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
        "numpy": {
            "name": name,
            "keys": keys.tolist(),  # Python ints, as many as the generator has
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    # Only the current device's generator, and only if CUDA is in use: asking for every
    # device's state would initialise CUDA contexts on GPUs this rank never touches.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set this process's generators to `state` (from `capture_rng`)."""
    torch.set_rng_state(state["torch_cpu"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        (
            n["name"],
            np.array(n["keys"], dtype=np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"], torch.cuda.current_device())


def derived_seed(base_seed: int, step: int, rank: int) -> int:
    """The seed of a rank that has no saved state (see the module docstring)."""
    return stable_u64(f"trainguard-rng:{base_seed}:{step}:{rank}") & ((1 << 63) - 1)


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)  # also seeds every CUDA device
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
