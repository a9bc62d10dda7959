"""`trainguard eval RUN_DIR --model module:function`: the model of any run record's newest
verified checkpoint, built by the user's factory and loaded with the checkpoint's weights.

The record's run.json says where the checkpoints are and how they are laid out
(`report.checkpoints.checkpoint_root`): a `Checkpointer`'s `step-N/` (FlatLayout: the module
under the state's "model" key of state.json + state.safetensors), a Hugging Face Trainer's
`checkpoint-N/model.safetensors`, a Lightning `VerifiedModelCheckpoint`'s
`step-N/checkpoint.ckpt` (`torch.load(weights_only=True)`: no code is unpickled). Each folder is
verified in full (manifest, sizes, checksums) before anything in it is read; a damaged one is a
finding and the next older one is tried. `load_weights` is the one place the weights are read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainguard.checkpoint.folder import inspect_local_folder, listed_path, open_listed
from trainguard.errors import BadInputError, CorruptError
from trainguard.evals.load import EvalTarget
from trainguard.findings import Finding, has_errors
from trainguard.metrics.record_read import RunRecord
from trainguard.numerics.logits import extract_logits
from trainguard.report.checkpoints import HF_PREFIX, checkpoint_root
from trainguard.util.paths import is_remote, local_path

STATE_KEY = "model"  # the key of the module in the Checkpointer's state (docs/own-loop.md)


def load_weights(model: torch.nn.Module, folder: Path, layout: str) -> None:
    """Load the module's weights of a verified checkpoint folder of `layout` into `model`
    (strict: every parameter, no other)."""
    if layout == "hf":  # load_model restores tied weights (wte, lm_head) saved once
        from safetensors.torch import load_model

        with listed_path(folder, "model.safetensors") as path:
            load_model(model, path, strict=True)
        return
    if layout == "lightning":
        with open_listed(folder, "checkpoint.ckpt") as f:
            doc = torch.load(f, map_location="cpu", weights_only=True)
        model.load_state_dict(doc["state_dict"], strict=True)
        return
    # A Checkpointer step, flat or sharded (DCP): the one reader of a module's weights.
    from trainguard.checkpoint.read import read_module_state

    model.load_state_dict(read_module_state(folder, STATE_KEY), strict=True)


class LogitsOnly(torch.nn.Module):
    """The user's model as the evals call it: token ids (B, T) -> logits (B, T, V), whatever
    it returns (a Hugging Face output object, a tuple, a dict: `numerics.logits`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return extract_logits(self.model(idx))


def _folders(root: Path, layout: str) -> dict[int, Path]:
    prefix = HF_PREFIX if layout == "hf" else "step-"
    out = {}
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        digits = entry.name[len(prefix) :]
        if entry.name.startswith(prefix) and digits.isascii() and digits.isdigit():
            out[int(digits)] = entry
    return out


def open_record_for_eval(
    record: RunRecord, model: torch.nn.Module, tokenizer: Any, device: str = "cpu"
) -> EvalTarget:
    """`model` (built by the user's factory) with the weights of the record's newest checkpoint
    that verifies and loads; model None (and the findings why) when none does."""
    root, layout = checkpoint_root(record)
    if is_remote(root):
        raise BadInputError(
            f"{record.run_dir}'s checkpoints are on an object store ({root})",
            "copy the checkpoint folder here and evaluate it: trainguard eval CHECKPOINT_DIR",
        )
    folders = _folders(Path(local_path(root)), layout)
    if not folders:
        raise BadInputError(
            f"{record.run_dir} records no checkpoint under {root}",
            "evaluate a run that saved checkpoints (Checkpointer, the Trainer's save_steps, "
            "VerifiedModelCheckpoint)",
        )
    findings: list[Finding] = []
    for step in sorted(folders, reverse=True):
        folder = folders[step]
        _, problems = inspect_local_folder(folder, step)
        findings += problems
        if has_errors(problems):
            continue
        try:
            load_weights(model, folder, layout)
        except (RuntimeError, KeyError, CorruptError, OSError) as e:
            findings.append(
                Finding.of(
                    "C111",
                    f"step {step} ({folder}): the weights do not load into the model the "
                    f"factory built: {' '.join(str(e).split())[:400]}",
                    step=step,
                )
            )
            continue
        wrapped = LogitsOnly(model).to(device).eval()
        return EvalTarget(wrapped, tokenizer, None, folder, findings)
    return EvalTarget(None, tokenizer, None, None, findings)
