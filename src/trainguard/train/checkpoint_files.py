"""The files of a `trainguard run` checkpoint, written and read back, every file checked before
anything changes.

    step-<N>/model.safetensors   the weights (safetensors; tied weights stored once)
             optimizer.pt        the optimizer state (tensors and numbers: weights_only=True)
             rng.pt              every rank's generator states (`checkpoint/rng.py`), by rank
             loader.json         where the next step reads in the data order (for humans; checked)
             trainer.json        step, tokens seen, skipped data ranges, the guard's and the
                                 callbacks' state
             recipe.yaml, env.json   the recipe and the software it ran with
             manifest.json       written last by the store (sizes and checksums)

`eval`, `report`, `check-tokenizer` and the drills read `model.safetensors`. A checkpoint that
verifies (its checksums match its manifest) is still untrusted data: the manifest can be
rewritten to bless any content, or to leave a file out. `read_checkpoint` reads and checks
every file against the model, the optimizer and the sampler without touching them, and names
the first file that does not fit (UnloadableCheckpoint, reported as C111). Every file is opened
through `checkpoint.folder.open_listed`: one the manifest does not list is never opened (a
FIFO there would block the resume forever, a link would read a file outside the checkpoint).
Nothing is ever unpickled; torch's advice to pass `weights_only=False` is never passed on,
since following it would run the file's code.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_model

from trainguard.checkpoint.folder import listed_path, open_listed
from trainguard.checkpoint.inventory import load_error_words
from trainguard.checkpoint.staging import StagedModel
from trainguard.data.order import LoaderState
from trainguard.data.sampler import ElasticSampler
from trainguard.train.checkpoint_checks import generator_state, model_problem, optimizer_problem
from trainguard.train.optim import Optimizer
from trainguard.train.schedule import LrSchedule

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
LOADER_FILE = "loader.json"
RNG_FILE = "rng.pt"
TRAINER_FILE = "trainer.json"
RECIPE_FILE = "recipe.yaml"
ENV_FILE = "env.json"
# What `read_checkpoint` reads: a step whose manifest lacks one is passed over (C111).
READ_FILES = (MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, TRAINER_FILE, LOADER_FILE, ENV_FILE)


class UnloadableCheckpoint(Exception):
    """A verified checkpoint file that does not load: `file` and `why`, in words."""

    def __init__(self, file: str, why: str) -> None:
        super().__init__(f"{file}: {why}")
        self.file, self.why = file, why


@dataclass
class CheckpointContent:
    """Everything a checkpoint restores, read and checked (the weights stay in their file)."""

    trainer: dict[str, Any]  # step, tokens_seen, skipped_positions, guard, callbacks
    optimizer: Any
    rng: list[dict[str, Any]]  # per rank, `checkpoint.rng.capture_rng`'s form
    env: dict[str, Any]


@dataclass
class CheckpointFiles:
    """What `write_checkpoint_files` writes: captured in the caller's thread (the layout's
    snapshot; copied by `checkpoint/staging.py` for an asynchronous save, the weights and the
    optimizer state in the writer thread with `stage`), written wherever the store says."""

    model: torch.nn.Module | StagedModel  # what save_model reads: its state_dict()
    optimizer: Any
    rng: list[dict[str, Any]]
    trainer: dict[str, Any]
    loader: dict[str, int]
    recipe: str
    """recipe.yaml's text: the recipe does not change during a run, so it is rendered once."""
    env: dict[str, Any]


def write_checkpoint_files(folder: Path, files: CheckpointFiles) -> None:
    """Every payload file of a checkpoint into `folder` (the store adds the manifest)."""
    save_model(files.model, str(folder / MODEL_FILE))
    torch.save(files.optimizer, folder / OPTIMIZER_FILE)
    # rank 0's CPU state also at the top level, where checkpoints before per-rank states had it
    torch.save({"torch_cpu": files.rng[0]["torch_cpu"], "ranks": files.rng}, folder / RNG_FILE)
    (folder / LOADER_FILE).write_text(json.dumps(files.loader, indent=2))
    (folder / TRAINER_FILE).write_text(json.dumps(files.trainer, indent=2))
    (folder / RECIPE_FILE).write_text(files.recipe)
    (folder / ENV_FILE).write_text(json.dumps(files.env, indent=2))


# -- reading ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def _reading(file: str) -> Iterator[None]:
    try:
        yield
    except UnloadableCheckpoint:
        raise
    except Exception as e:
        raise UnloadableCheckpoint(file, load_error_words(e)) from None


def _json(folder: Path, file: str) -> Any:
    with _reading(file), open_listed(folder, file) as f:
        return json.loads(f.read().decode("utf-8"))


def _torch(folder: Path, file: str) -> Any:
    """A torch.save file's tensors and plain values; never unpickles objects."""
    with _reading(file), open_listed(folder, file) as f:
        return torch.load(f, weights_only=True)


def _nonneg_int(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} is {value!r}, not a non-negative integer")
    return value


def _trainer_doc(doc: Any, step: int | None, sampler: ElasticSampler) -> dict[str, Any]:
    """trainer.json checked: counters, skipped ranges the sampler accepts, JSON-object states."""
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
    scratch = copy.copy(sampler)  # the ranges must be whole global batches of this run
    scratch.load_state_dict({**sampler.state_dict(), "skipped_positions": skipped})
    callbacks = doc.get("callbacks")
    if callbacks is None:  # written before the callbacks: the eval hook's state, one object
        evals = doc.get("evals", {})
        callbacks = evals
        if isinstance(evals, dict):  # one object held the evals, off-track and reference state
            callbacks = {"evals": evals, "validation": evals}
            callbacks["reference"] = evals.get("reference") or {}
    guard = doc.get("guard", {})
    if not isinstance(guard, dict) or not isinstance(callbacks, dict):
        raise ValueError("guard and callbacks must be JSON objects")
    if not all(isinstance(v, dict) for v in callbacks.values()):
        raise ValueError("every callback's state must be a JSON object")
    schedule = doc.get("schedule") or None  # absent before LR schedules were saved
    if schedule is not None:  # the segments' shape (the recipe's warm-up and floor come later)
        LrSchedule.from_list(0, 0.0, schedule)
    return {
        "step": saved_step,
        "tokens_seen": _nonneg_int(doc, "tokens_seen"),
        "skipped_positions": skipped,
        "guard": guard,
        "callbacks": callbacks,
        "schedule": schedule,
        "sampler": scratch,
    }


def _rng(folder: Path, trainer_doc: dict[str, Any]) -> list[dict[str, Any]]:
    saved = _torch(folder, RNG_FILE)
    with _reading(RNG_FILE):
        if isinstance(saved, dict) and "ranks" in saved:
            if not isinstance(saved["ranks"], list) or not saved["ranks"]:
                raise ValueError("it holds no rank's generator states")
            return [generator_state(s) for s in saved["ranks"]]
    with _reading(TRAINER_FILE):
        python = trainer_doc.get("python_random")
        if not (isinstance(python, list) and len(python) == 3):
            raise ValueError("python_random is not the [version, state, gauss] trainguard writes")
    with _reading(RNG_FILE):
        return [generator_state(saved, python)]


def read_checkpoint(
    folder: Path,
    model: torch.nn.Module,
    optimizer: Optimizer,
    sampler: ElasticSampler,
    step: int | None = None,
) -> CheckpointContent:
    """Read and check every file of a verified checkpoint folder against `model`, `optimizer`
    and `sampler`, changing none of them; UnloadableCheckpoint names the first file that does
    not fit. `step`: the manifest's step, which trainer.json must agree with."""
    with _reading(MODEL_FILE), listed_path(folder, MODEL_FILE) as path:
        problem = model_problem(model, Path(path))
    if problem:
        raise UnloadableCheckpoint(MODEL_FILE, problem)
    optim_state = _torch(folder, OPTIMIZER_FILE)
    problem = optimizer_problem(optimizer, optim_state)
    if problem:
        raise UnloadableCheckpoint(OPTIMIZER_FILE, problem)
    doc = _json(folder, TRAINER_FILE)
    rng = _rng(folder, doc if isinstance(doc, dict) else {})
    with _reading(TRAINER_FILE):
        trainer = _trainer_doc(doc, step, sampler)
    loader = _json(folder, LOADER_FILE)
    with _reading(LOADER_FILE):
        position = LoaderState.from_dict(loader).global_position
        # A step's loader position may point into a range a rollback skipped: the next read
        # jumps over it, as the sampler's position does.
        skipped = {a: b for a, b in trainer["skipped_positions"]}
        while position in skipped:
            position = skipped[position]
        expected = trainer["sampler"].position(trainer["step"])
        if position != expected:
            raise ValueError(
                f"it says global position {position}; step {trainer['step']} with the "
                f"recorded skips reads at {expected}"
            )
    env = _json(folder, ENV_FILE)
    if not isinstance(env, dict):
        raise UnloadableCheckpoint(ENV_FILE, "it is not a JSON object")
    return CheckpointContent(trainer, optim_state, rng, env)
