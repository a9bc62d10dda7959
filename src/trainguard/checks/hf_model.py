"""`check-model --hf PATH_OR_CONFIG_JSON`: a Hugging Face architecture, built from its config.

The model is built with `AutoModelForCausalLM.from_config` (random weights, seeded; nothing is
downloaded and no weights are read: causality and batch independence are properties of the
architecture and its config, not of trained weights). Remote code (`auto_map`) is never run:
a config is data. HF models return an output object whose `.logits` the checks read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from trainguard.checks.model_target import ModelTargetError, load_model

_FIX = "give --hf a config.json or a model folder holding one (as save_pretrained writes)"


def _config_file(path_or_config: str) -> Path:
    path = Path(path_or_config)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ModelTargetError(f"{path_or_config} has no config.json", _FIX)
    elif not path.is_file():
        raise ModelTargetError(f"--hf {path_or_config} does not exist", _FIX)
    return path


def load_hf_model(path_or_config: str, seed: int = 0) -> nn.Module:
    """The causal LM a Hugging Face config describes, randomly initialised from `seed`."""
    path = _config_file(path_or_config)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelTargetError(f"{path} is not valid JSON ({e})", _FIX) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise ModelTargetError(
            f"{path} has no model_type: not a Hugging Face model config",
            "give the config.json of a transformers model (it names its model_type)",
        )
    if raw.get("auto_map"):
        raise ModelTargetError(
            f"{path} needs remote code (auto_map), which trainguard never runs",
            "check an architecture that transformers ships, or wrap yours in a factory "
            "(check-model path/to/file.py:factory)",
        )
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise ModelTargetError(
            "--hf needs the transformers package", "pip install transformers"
        ) from None
    fields = dict(raw)
    model_type = fields.pop("model_type")
    try:
        config = AutoConfig.for_model(model_type, **fields)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the weights depend on the seed alone
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError) as e:
        raise ModelTargetError(
            f"transformers cannot build a causal LM from {path} (model_type {model_type!r}): {e}",
            "give the config of a decoder (causal language model) architecture",
        ) from None
    return model.float()


def load_target(target: str | None, hf: str | None, seed: int = 0) -> tuple[nn.Module, str]:
    """The model to check and its label: a factory TARGET or a Hugging Face config (--hf)."""
    if (target is None) == (hf is None):
        raise ModelTargetError(
            "give either TARGET (a factory) or --hf PATH_OR_CONFIG_JSON, not both or neither",
            "check-model path/to/file.py:factory, or check-model --hf path/to/config.json",
        )
    if hf is not None:
        return load_hf_model(hf, seed), f"hf:{hf}"
    assert target is not None
    return load_model(target), target
