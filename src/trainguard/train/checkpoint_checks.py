"""Whether a checkpoint's content fits the run that reads it: the weights' names and shapes
(from the safetensors header, nothing loaded), the optimizer state's groups and per-parameter
tensors, and each rank's generator states (tried on scratch generators). Pure: nothing of the
run changes; each returns the problem in words, or raises ValueError for `_reading` to name the
file."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from trainguard.checkpoint.rng import capture_rng
from trainguard.train.optim import Optimizer, OptimizerSet


def model_problem(model: torch.nn.Module, path: Path) -> str | None:
    """Why the safetensors file does not fit `model` (names, shapes), read from its header."""
    expected = model.state_dict()
    with safe_open(str(path), framework="pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    unknown = sorted(set(shapes) - set(expected))
    if unknown:
        return f"it holds tensors the model does not have ({', '.join(unknown[:3])})"
    for key, shape in shapes.items():
        if shape != list(expected[key].shape):
            return f"{key} has shape {shape}, the model's is {list(expected[key].shape)}"
    # Tied weights are stored once (safetensors' save_model): a key missing from the file is
    # fine if it shares its storage with one that is there.
    stored = {expected[k].untyped_storage().data_ptr() for k in shapes}
    missing = [
        k
        for k in expected
        if k not in shapes and expected[k].untyped_storage().data_ptr() not in stored
    ]
    return f"it lacks {', '.join(missing[:3])}" if missing else None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def optimizer_problem(optimizer: Optimizer, state: Any) -> str | None:
    """Why `state` is not a state dict of `optimizer`: parts, param groups, or a per-parameter
    tensor (a moment, a momentum buffer) whose shape is not its parameter's."""
    if isinstance(optimizer, OptimizerSet):
        if not isinstance(state, dict) or set(state) != set(optimizer.optimizers):
            names = sorted(state) if isinstance(state, dict) else type(state).__name__
            return f"it holds {names}, the run's optimizers are {sorted(optimizer.optimizers)}"
        parts = [(state[n], o) for n, o in optimizer.optimizers.items()]
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
                if (
                    isinstance(value, torch.Tensor)
                    and value.ndim
                    and value.shape != params[i].shape
                ):
                    return (
                        f"{name} of parameter {i} has shape {list(value.shape)}, the "
                        f"parameter's is {list(params[i].shape)}"
                    )
    return None


def generator_state(state: Any, python: Any = None) -> dict[str, Any]:
    """One rank's generator states (`checkpoint.rng.capture_rng`'s form), checked on scratch
    generators: nothing is set. `python`: trainer.json's `python_random` of a checkpoint that
    saved only rank 0's torch and Python states (numpy keeps its current state)."""
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
    return state
