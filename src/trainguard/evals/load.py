"""Load a run's model for evaluation: a run dir (newest usable checkpoint) or a checkpoint.

Checkpoints go through the verified loader (`checkpoint.target.open_checkpoint`): a damaged
checkpoint is a finding (C101-C111), a run dir falls back to the previous valid one, and a
single damaged checkpoint gives no model at all. Weights come from the step's "model" module
(`checkpoint.read.read_module_state`: any Checkpointer checkpoint, flat or sharded; JSON and
safetensors only, never unpickled: docs/architecture.md, convention 10). A step of the run's
earlier format is refused with the command that converts it (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainguard.checkpoint.checkpointer_load import LegacyRunCheckpoint, is_legacy_run_step
from trainguard.checkpoint.inventory import load_error_words, unloadable
from trainguard.checkpoint.read import STATE_TENSORS, read_module_state
from trainguard.checkpoint.results import LoadedCheckpoint
from trainguard.checkpoint.target import is_checkpoint_folder, open_checkpoint
from trainguard.errors import BadInputError, CorruptError
from trainguard.findings import Finding


@dataclass
class EvalTarget:
    """The model to evaluate (None when no checkpoint was usable), its tokenizer and recipe,
    the checkpoint folder it came from, and the findings of the verification."""

    model: torch.nn.Module | None
    tokenizer: Any
    recipe: Any
    checkpoint: Path | None
    findings: list[Finding]


def _find_up(start: Path, name: str, levels: int = 3) -> Path | None:
    for folder in [start, *list(start.parents)[:levels]]:
        if (folder / name).is_file():
            return folder / name
    return None


def open_for_eval(target: str | Path, device: str | torch.device = "cpu") -> EvalTarget:
    """The recipe's model with the weights of the newest usable checkpoint of a run dir, or of
    one checkpoint folder, in eval mode; BadInputError if the recipe or tokenizer is missing."""
    from trainguard.config.load import read_recipe_yaml, validate_recipe
    from trainguard.data.tokenizer import load_tokenizer
    from trainguard.model.gpt import GPT

    target = Path(target)
    if not target.exists():
        raise BadInputError(f"{target} does not exist", "give a run dir or a checkpoint step-<N>/")
    recipe_path = _find_up(target, "recipe.yaml")
    tok_path = _find_up(target, "tokenizer.json")
    if recipe_path is None or tok_path is None:
        missing = "recipe.yaml" if recipe_path is None else "tokenizer.json"
        raise BadInputError(
            f"no {missing} in {target} or the run dir above it",
            "evaluate a checkpoint inside its run dir (trainguard writes both there)",
        )
    fix = "restore the run's recipe.yaml (trainguard wrote it when the run started)"
    raw = read_recipe_yaml(recipe_path, "the run's recipe", fix)
    recipe = validate_recipe(raw, str(recipe_path))
    tokenizer = load_tokenizer(tok_path)
    model = GPT(recipe.model, vocab_size=tokenizer.get_vocab_size(), seq_len=recipe.data.seq_len)

    def usable(loaded: LoadedCheckpoint) -> list[Finding]:
        if is_legacy_run_step(loaded.manifest):
            run_dir = target if not is_checkpoint_folder(target) else target.parent.parent
            raise LegacyRunCheckpoint(loaded.step, str(loaded.path.parent), str(run_dir))
        try:
            # A shape error leaves the model partly loaded; the next candidate is loaded in
            # full (strict) over it.
            model.load_state_dict(read_module_state(loaded.path, "model"), strict=True)
        except Exception as e:
            return [unloadable(loaded.step, loaded.path, STATE_TENSORS, load_error_words(e))]
        return []

    loaded, findings = open_checkpoint(target, usable)
    if loaded is None:
        return EvalTarget(None, tokenizer, recipe, None, findings)
    model.to(device).eval()
    return EvalTarget(model, tokenizer, recipe, loaded.path, findings)


def load_model_for_eval(
    run_dir_or_checkpoint: str | Path, device: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, Any, Any]:
    """(model in eval mode, tokenizer, recipe); CorruptError when no checkpoint is usable."""
    opened = open_for_eval(run_dir_or_checkpoint, device)
    if opened.model is None:
        raise CorruptError(
            f"no usable checkpoint in {run_dir_or_checkpoint}: "
            + "; ".join(f.message for f in opened.findings if f.severity == "error"),
            "evaluate another checkpoint, or restore this one from a copy",
        )
    return opened.model, opened.tokenizer, opened.recipe
