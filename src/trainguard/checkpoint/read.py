"""Reading a verified step without a loop: one module's weights for `eval`, `check-tokenizer`,
the drills and reference records (`read_module_state`), and the pre-load check of a whole step
against a caller's state (`state_problem`, FlatLayout.check).

Every file is opened through `checkpoint.folder.open_listed`/`listed_path`: a name the step's
manifest does not list is never opened. Nothing is unpickled: state.json is JSON, tensors come
from safetensors, and a sharded step's `.metadata` goes through `dcp_safe`'s restricted reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from trainguard.checkpoint import codec
from trainguard.checkpoint.dcp_files import METADATA_FILE
from trainguard.checkpoint.fit import Saved, generator_state, part_problem
from trainguard.checkpoint.folder import listed_files, listed_path, open_listed
from trainguard.checkpoint.inventory import load_error_words
from trainguard.errors import BadInputError, CorruptError

STATE_JSON, STATE_TENSORS = codec.state_files("state")


def _skeleton(folder: Path) -> dict[str, Any]:
    with open_listed(folder, STATE_JSON) as f:
        doc = json.loads(f.read().decode("utf-8"))
    if not (isinstance(doc, dict) and isinstance(doc.get("values"), dict)):
        raise ValueError("it is not the state.json a Checkpointer writes")
    return doc


def read_module_state(folder: Path, key: str = "model") -> dict[str, torch.Tensor]:
    """The state dict of the module saved under `key` in a verified step folder (flat or
    sharded), on the CPU; BadInputError when the step holds no module `key`, CorruptError
    when its files do not read."""
    folder = Path(folder)
    files = listed_files(folder)
    if METADATA_FILE in files:
        from trainguard.checkpoint.sharded_read import read_sharded_module

        return read_sharded_module(folder, key)
    try:
        doc = _skeleton(folder)
    except Exception as e:
        raise CorruptError(
            f"cannot read {STATE_JSON} in {folder}: {load_error_words(e)}",
            "read another checkpoint step",
        ) from e
    kind = (doc.get("kinds") or {}).get(key)
    if kind != "module":
        held = sorted(k for k, v in (doc.get("kinds") or {}).items() if v == "module")
        raise BadInputError(
            f"checkpoint {folder} holds no module {key!r} (its modules: {held})",
            "name a module key the checkpoint holds",
        )
    skeleton = doc["values"][key]
    keys = {s["key"] for s in skeleton.values() if isinstance(s, dict) and "key" in s}
    try:
        with listed_path(folder, STATE_TENSORS) as path, safe_open(path, framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in keys}
        state = codec.decode(skeleton, tensors)
    except Exception as e:
        raise CorruptError(
            f"cannot read {STATE_TENSORS} in {folder}: {load_error_words(e)}",
            "read another checkpoint step",
        ) from e
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CorruptError(f"module {key!r} of {folder} is not a state dict", "read another step")
    return state


def state_problem(folder: Path, parts: list[Any], step: int) -> tuple[str, str] | None:
    """(file, why) when step `step` in `folder` does not fit `parts` (the caller's state,
    `layout.classify`'s), read from state.json and the tensors' header; None when it fits.
    Nothing of the caller's changes."""
    try:
        doc = _skeleton(folder)
    except Exception as e:
        return STATE_JSON, load_error_words(e)
    mine = {p.key: p.kind for p in parts}
    if doc.get("kinds") != mine:
        return STATE_JSON, f"it holds state keys {doc.get('kinds')}, the state passed {mine}"
    try:
        with listed_path(folder, STATE_TENSORS) as path, safe_open(path, framework="pt") as f:
            described = {k: Saved(f.get_slice(k).get_shape(), "") for k in f.keys()}  # noqa: SIM118
            rng = codec.decode(doc.get("rng"), _Tensors(f))
    except Exception as e:
        return STATE_TENSORS, load_error_words(e)
    try:
        if not isinstance(rng, list):
            raise ValueError("it holds no rank's generator states")
        for r in rng:
            generator_state(r)
    except (ValueError, TypeError, KeyError) as e:
        return STATE_TENSORS, f"rng: {e}"
    for p in parts:
        try:
            saved = codec.decode(doc["values"].get(p.key), described)
            why = part_problem(p.kind, p.value, saved)
        except Exception as e:
            why = load_error_words(e)
        if why:
            return STATE_JSON, f"{p.where}: {why}"
    return None


class _Tensors:
    """The tensors of an open safetensors file, read when asked for (the small ones)."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.f.get_tensor(key)
