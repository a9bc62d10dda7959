"""Serialise the training state into checkpoint files (train/state_load.py reads them back).

Weights go to safetensors and everything else to JSON or tensors-only `torch.save` files that
load with `weights_only=True`: nothing in a checkpoint is ever unpickled (docs/architecture.md,
convention 10). Everything a bitwise resume needs is here: weights, AdamW moments, the step,
the data position, the RNG states (dropout) and the monitors' windows.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save_model

from trainguard.data.order import LoaderState
from trainguard.train.optim import Optimizer

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
LOADER_FILE = "loader.json"
RNG_FILE = "rng.pt"
TRAINER_FILE = "trainer.json"
RECIPE_FILE = "recipe.yaml"
ENV_FILE = "env.json"


@dataclass
class TrainerState:
    """The loop's own counters; the data position is the loader state."""

    step: int = 0
    tokens_seen: int = 0
    loader: LoaderState = field(default_factory=LoaderState)
    skipped_positions: list[list[int]] = field(default_factory=list)
    guard: dict[str, Any] = field(default_factory=dict)
    evals: dict[str, Any] = field(default_factory=dict)
    schedule: list[dict[str, Any]] = field(default_factory=list)
    """The LR schedule's segments (train/schedule.py); empty: the recipe's plain cosine."""

    @property
    def loader_position(self) -> int:
        """The global position in the elastic order: what the next step reads from."""
        return self.loader.global_position

    def advance(self, samples: int, tokens: int, num_samples: int) -> None:
        """One step consumed `samples` sequences of the order and trained on `tokens` tokens."""
        self.step += 1
        self.tokens_seen += tokens
        self.skip_data(samples, num_samples)

    def skip_data(self, samples: int, num_samples: int) -> None:
        self.loader = self.loader.advanced(samples, num_samples)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "loader": self.loader.to_dict(),
            "skipped_positions": self.skipped_positions,
            "guard": self.guard,
            "evals": self.evals,
            "schedule": self.schedule,
        }


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            state[f"torch_cuda_{i}"] = s
    return state


def write_checkpoint_files(
    folder: Path,
    model: torch.nn.Module,
    optimizer: Optimizer,
    trainer: TrainerState,
    recipe: dict[str, Any],
    env: dict[str, Any],
) -> None:
    """Write every payload file of a checkpoint into `folder` (the store adds the manifest)."""
    save_model(model, str(folder / MODEL_FILE))
    torch.save(optimizer.state_dict(), folder / OPTIMIZER_FILE)
    torch.save(_rng_state(), folder / RNG_FILE)
    (folder / LOADER_FILE).write_text(json.dumps(trainer.loader.to_dict(), indent=2))
    trainer_doc = trainer.to_dict() | {"python_random": _py_random_state()}
    (folder / TRAINER_FILE).write_text(json.dumps(trainer_doc, indent=2))
    (folder / RECIPE_FILE).write_text(yaml.safe_dump(recipe, sort_keys=False))
    (folder / ENV_FILE).write_text(json.dumps(env, indent=2))


def _py_random_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]
