"""Reading a checkpoint back into the training state: every file checked before anything
changes.

A checkpoint that verifies (its checksums match its manifest) is still untrusted data: the
manifest can be rewritten to bless any content. `read_checkpoint` reads and checks every file
against the model and the optimizer without touching them, and names the first file that does
not fit (UnloadableCheckpoint, reported as C111); `apply_checkpoint` then loads what was read.
Torch's unpickling errors suggest `weights_only=False`; that advice is never passed on, since
following it would run whatever code the file holds.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_model

from trainguard.checkpoint.inventory import load_error_words
from trainguard.data.order import LoaderState
from trainguard.train.optim import Optimizer, OptimizerSet
from trainguard.train.schedule import LrSchedule
from trainguard.train.state import (
    ENV_FILE,
    LOADER_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    RNG_FILE,
    TRAINER_FILE,
    TrainerState,
)


class UnloadableCheckpoint(Exception):
    """A verified checkpoint file that does not load: `file` and `why`, in words."""

    def __init__(self, file: str, why: str) -> None:
        super().__init__(f"{file}: {why}")
        self.file, self.why = file, why


@dataclass
class CheckpointContent:
    """Everything `apply_checkpoint` needs, read and checked."""

    trainer: TrainerState
    env: dict[str, Any]
    rng: dict[str, torch.Tensor]
    python_random: tuple[Any, ...]
    optimizer: dict[str, Any] | None


@contextlib.contextmanager
def _reading(file: str) -> Iterator[None]:
    try:
        yield
    except UnloadableCheckpoint:
        raise
    except Exception as e:
        raise UnloadableCheckpoint(file, load_error_words(e)) from None


def _json(folder: Path, file: str) -> Any:
    with _reading(file):
        return json.loads((folder / file).read_text(encoding="utf-8"))


def _model_problem(model: torch.nn.Module, path: Path) -> str | None:
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


def _nonneg_int(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} is {value!r}, not a non-negative integer")
    return value


def _trainer_state(doc: Any, step: int | None) -> tuple[TrainerState, tuple[Any, ...]]:
    if not isinstance(doc, dict):
        raise ValueError("it is not a JSON object")
    saved_step = _nonneg_int(doc, "step")
    if step is not None and saved_step != step:
        raise ValueError(f"it says step {saved_step}, its manifest says step {step}")
    skipped = doc.get("skipped_positions", [])
    if not isinstance(skipped, list) or not all(
        isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r) for r in skipped
    ):
        raise ValueError("skipped_positions is not a list of [start, end] integer pairs")
    guard, evals = doc.get("guard", {}), doc.get("evals", {})
    if not isinstance(guard, dict) or not isinstance(evals, dict):
        raise ValueError("guard and evals must be JSON objects")
    schedule = doc.get("schedule", [])
    if schedule:  # the segments' shape (the recipe's warm-up and floor come in later)
        LrSchedule.from_list(0, 0.0, schedule)
    saved_random = doc.get("python_random")
    if not (isinstance(saved_random, list) and len(saved_random) == 3):
        raise ValueError("python_random is not the [version, state, gauss] trainguard writes")
    version, internal, gauss = saved_random
    python_random = (version, tuple(internal), gauss)
    random.Random().setstate(python_random)  # checks it on a scratch generator
    state = TrainerState(
        step=saved_step,
        tokens_seen=_nonneg_int(doc, "tokens_seen"),
        skipped_positions=skipped,
        guard=guard,
        evals=evals,
        schedule=schedule,
    )
    return state, python_random


def read_checkpoint(
    folder: Path, model: torch.nn.Module, optimizer: Optimizer | None, step: int | None = None
) -> CheckpointContent:
    """Read and check every file of a verified checkpoint folder against `model` and
    `optimizer`, changing neither; UnloadableCheckpoint names the first file that does not fit.
    `step`: the manifest's step, which trainer.json must agree with."""
    with _reading(MODEL_FILE):
        problem = _model_problem(model, folder / MODEL_FILE)
    if problem:
        raise UnloadableCheckpoint(MODEL_FILE, problem)
    optim_state = None
    if optimizer is not None:
        with _reading(OPTIMIZER_FILE):
            optim_state = torch.load(folder / OPTIMIZER_FILE, weights_only=True)
        problem = optimizer_problem(optimizer, optim_state)
        if problem:
            raise UnloadableCheckpoint(OPTIMIZER_FILE, problem)
    with _reading(RNG_FILE):
        rng = torch.load(folder / RNG_FILE, weights_only=True)
    cpu = rng.get("torch_cpu") if isinstance(rng, dict) else None
    reference = torch.get_rng_state()
    if not (
        isinstance(cpu, torch.Tensor)
        and cpu.dtype == reference.dtype
        and cpu.shape == reference.shape
    ):
        raise UnloadableCheckpoint(RNG_FILE, "it is not the RNG state trainguard writes")
    doc = _json(folder, TRAINER_FILE)
    with _reading(TRAINER_FILE):
        trainer, python_random = _trainer_state(doc, step)
    loader = _json(folder, LOADER_FILE)
    with _reading(LOADER_FILE):
        trainer.loader = LoaderState.from_dict(loader)
    env = _json(folder, ENV_FILE)
    if not isinstance(env, dict):
        raise UnloadableCheckpoint(ENV_FILE, "it is not a JSON object")
    return CheckpointContent(trainer, env, rng, python_random, optim_state)


def apply_checkpoint(
    content: CheckpointContent, folder: Path, model: torch.nn.Module, optimizer: Optimizer | None
) -> tuple[TrainerState, dict[str, Any]]:
    """Load what `read_checkpoint` read into `model` and `optimizer` and restore the RNGs;
    returns the trainer state and the environment fingerprint the checkpoint was written with."""
    # load_model, not load_file + load_state_dict: it restores tied weights stored once.
    load_model(model, str(folder / MODEL_FILE), strict=True)
    if optimizer is not None and content.optimizer is not None:
        optimizer.load_state_dict(content.optimizer)
    torch.set_rng_state(content.rng["torch_cpu"])
    if torch.cuda.is_available():
        states = [content.rng[k] for k in sorted(content.rng) if k.startswith("torch_cuda_")]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
    random.setstate(content.python_random)
    return content.trainer, content.env
