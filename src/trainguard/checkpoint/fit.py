"""Whether a saved state fits the objects that would load it, decided before anything changes.

A checkpoint that verifies (its checksums match its manifest) is still untrusted data: the
manifest can bless any content. `FlatLayout.check` reads a step's `state.json` and the header
of its `state.safetensors` (names, shapes; no tensor data) and asks, per part of the caller's
state: a module's tensor names and shapes (`module_problem`), an optimizer's parameter groups
and per-parameter state shapes (`optimizer_problem`), a stateful object's own answer where it
has one (`state_problem(state) -> str | None`: the ElasticSampler's), and each rank's
generator states (`generator_state`, tried on scratch generators). Each returns the problem in
words; nothing of the caller's changes, so a step that does not fit is passed over like a
corrupt one (C111) and the loop never holds a half-loaded model.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from trainguard.checkpoint.rng import capture_rng


class Saved:
    """A tensor of the checkpoint as its header describes it (no data read)."""

    def __init__(self, shape: list[int], dtype: str) -> None:
        self.shape, self.dtype = tuple(shape), dtype

    def numpy(self) -> Saved:  # the codec's numpy arrays: the description stands for them
        return self

    def copy(self) -> Saved:
        return self


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, torch.Tensor | Saved):
        return tuple(value.shape)
    return None


def module_problem(module: torch.nn.Module, saved: Any) -> str | None:
    """Why `saved` (a state dict: names -> tensors or their descriptions) does not fit
    `module`: a name it lacks or does not have, or a shape that differs."""
    if not isinstance(saved, dict):
        return "it is not a module's state dict"
    expected = module.state_dict()
    unknown = sorted(set(saved) - set(expected))
    if unknown:
        return f"it holds tensors the model does not have ({', '.join(unknown[:3])})"
    missing = [k for k in expected if k not in saved]
    if missing:
        return f"it lacks {', '.join(missing[:3])}"
    for key, value in saved.items():
        shape, want = _shape(value), tuple(expected[key].shape)
        if shape != want:
            return f"{key} has shape {list(shape or ())}, the model's is {list(want)}"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_optimizer_like(value: Any) -> bool:
    """A torch optimizer, or a set of them saved as one (`optimizers`: name -> optimizer)."""
    return isinstance(value, torch.optim.Optimizer) or isinstance(
        getattr(value, "optimizers", None), dict
    )


def optimizer_problem(optimizer: Any, state: Any) -> str | None:
    """Why `state` is not a state dict of `optimizer`: parts, param groups, or a per-parameter
    tensor (a moment, a momentum buffer) whose shape is not its parameter's."""
    named = getattr(optimizer, "optimizers", None)
    if isinstance(named, dict):  # several optimizers saved as one, keyed by name
        if not isinstance(state, dict) or set(state) != set(named):
            names = sorted(state) if isinstance(state, dict) else type(state).__name__
            return f"it holds {names}, the run's optimizers are {sorted(named)}"
        parts = [(state[n], o) for n, o in named.items()]
    else:
        parts = [(state, optimizer)]
    for part, opt in parts:
        if not (
            isinstance(part, dict)
            and isinstance(part.get("state"), dict)
            and isinstance(part.get("param_groups"), list)
        ):
            return "it is not an optimizer state dict"
        saved = part["param_groups"]
        if len(saved) != len(opt.param_groups) or any(
            not isinstance(sg, dict) or len(sg.get("params", ())) != len(g["params"])
            for sg, g in zip(saved, opt.param_groups, strict=False)
        ):
            return "its parameter groups differ from the model's"
        for sg, g in zip(saved, opt.param_groups, strict=True):
            for key, current in g.items():
                if _is_number(current) and key in sg and not _is_number(sg[key]):
                    return f"its param group setting {key} is {sg[key]!r}, not a number"
        params = dict(
            zip(
                [i for sg in saved for i in sg["params"]],
                [p for g in opt.param_groups for p in g["params"]],
                strict=True,
            )
        )
        for i, entry in part["state"].items():
            if i not in params or not isinstance(entry, dict):
                return f"it holds state for an unknown parameter {i!r}"
            for name, value in entry.items():
                shape = _shape(value)
                if shape and shape != tuple(params[i].shape):
                    return (
                        f"{name} of parameter {i} has shape {list(shape)}, the "
                        f"parameter's is {list(params[i].shape)}"
                    )
    return None


def part_problem(kind: str, value: Any, saved: Any) -> str | None:
    """Why `saved` does not fit one part of the caller's state (None: it fits, or nothing
    cheap can tell)."""
    if kind == "module":
        return module_problem(value, saved)
    if kind in ("optimizer", "stateful") and is_optimizer_like(value):
        return optimizer_problem(value, saved)
    if kind == "stateful" and callable(getattr(value, "state_problem", None)):
        return value.state_problem(saved)
    if kind == "tensor" and _shape(saved) != tuple(value.shape):
        return f"it has shape {list(_shape(saved) or ())}, the tensor's is {list(value.shape)}"
    return None


def generator_state(state: Any, python: Any = None) -> dict[str, Any]:
    """One rank's generator states (`checkpoint.rng.capture_rng`'s form), checked on scratch
    generators: nothing is set; ValueError when they are not. `python`: the Python generator's
    state of a checkpoint that saved only rank 0's torch and Python states (numpy keeps its
    current state)."""
    reference = torch.get_rng_state()
    cpu = state.get("torch_cpu") if isinstance(state, dict) else None
    if not (
        isinstance(cpu, torch.Tensor)
        and cpu.dtype == reference.dtype
        and cpu.shape == reference.shape
    ):
        raise ValueError("it is not the RNG state trainguard writes")
    if python is not None:  # a checkpoint from before per-rank states: one rank, numpy unsaved
        state = {**capture_rng(), "torch_cpu": cpu, "python": python}
        state.pop("cuda", None)
    try:
        version, internal, gauss = state["python"]
        random.Random().setstate((version, tuple(internal), gauss))
        n = state["numpy"]
        np.random.RandomState().set_state(
            (
                n["name"],
                np.array(n["keys"], dtype=np.uint32),
                n["pos"],
                n["has_gauss"],
                n["cached_gaussian"],
            )
        )
        int(state["initial_seed"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"its generator states do not load: {type(e).__name__}: {e}") from None
    return state
