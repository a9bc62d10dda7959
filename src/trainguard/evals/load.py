"""Load a run's model for evaluation: a run dir (newest complete checkpoint) or a checkpoint.

Weights come from `model.safetensors` only: never unpickle (DESIGN.md, convention 10).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_model

from trainguard.errors import BadInputError

_STEP = re.compile(r"^step-(\d+)$")


def _complete(folder: Path) -> bool:
    # The manifest is written last: a step folder without one is an interrupted save.
    return (folder / "manifest.json").is_file() and (folder / "model.safetensors").is_file()


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder `path` names: itself, or the newest complete one of a run dir."""
    path = Path(path)
    if not path.exists():
        raise BadInputError(f"{path} does not exist", "give a run dir or a checkpoint step-<N>/")
    if (path / "model.safetensors").is_file():
        return path
    ckpts = path / "checkpoints"
    steps = []
    if ckpts.is_dir():
        for child in ckpts.iterdir():
            m = _STEP.match(child.name)
            if m and _complete(child):
                steps.append((int(m.group(1)), child))
    if not steps:
        raise BadInputError(
            f"{path} has no complete checkpoint (checkpoints/step-<N>/ with model.safetensors "
            "and manifest.json)",
            "train the run first, or point at a checkpoint folder",
        )
    return max(steps)[1]


def _find_up(start: Path, name: str, levels: int = 3) -> Path | None:
    for folder in [start, *list(start.parents)[:levels]]:
        if (folder / name).is_file():
            return folder / name
    return None


def load_model_for_eval(
    run_dir_or_checkpoint: str | Path, device: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, Any, Any]:
    """(model in eval mode, tokenizer, recipe) of a run dir's newest checkpoint or a checkpoint."""
    from trainguard.config.load import validate_recipe
    from trainguard.data.tokenizer import load_tokenizer
    from trainguard.model.gpt import GPT

    ckpt = find_checkpoint(run_dir_or_checkpoint)
    recipe_path = _find_up(ckpt, "recipe.yaml")
    tok_path = _find_up(ckpt, "tokenizer.json")
    if recipe_path is None or tok_path is None:
        missing = "recipe.yaml" if recipe_path is None else "tokenizer.json"
        raise BadInputError(
            f"no {missing} in {ckpt} or the run dir above it",
            "evaluate a checkpoint inside its run dir (trainguard writes both there)",
        )
    raw = yaml.safe_load(recipe_path.read_text(encoding="utf-8")) or {}
    recipe = validate_recipe(raw, str(recipe_path))
    tokenizer = load_tokenizer(tok_path)
    model = GPT(recipe.model, vocab_size=tokenizer.get_vocab_size(), seq_len=recipe.data.seq_len)
    try:
        # load_model, not load_file + load_state_dict: it restores tied weights (wte/lm_head)
        # that safetensors stores once.
        load_model(model, str(ckpt / "model.safetensors"))
    except RuntimeError as e:
        raise BadInputError(
            f"{ckpt / 'model.safetensors'} does not fit the recipe's model: {e}",
            "evaluate the checkpoint with the recipe.yaml and tokenizer.json of its own run",
        ) from None
    model.to(device).eval()
    return model, tokenizer, recipe
