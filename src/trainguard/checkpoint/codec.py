"""State without pickle: any nest of plain data and tensors as one JSON skeleton + safetensors.

A state dict (a module's, an optimizer's with integer keys and tuples, a sampler's) is split
into a JSON document in which every tensor is replaced by a reference, and a flat
{reference: tensor} table written with safetensors. Nothing here can run code on load: JSON
and safetensors hold data only. Types JSON lacks are tagged: tuples, dicts with non-string
keys, numpy arrays and scalars, torch dtypes and devices. Anything else is refused with the
path of the value, before a byte is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from trainguard.checkpoint.folder import listed_path, open_listed
from trainguard.errors import BadInputError, CorruptError

_SCALARS = frozenset({int, float, str, bool, type(None)})
TAG = "__tg__"  # marks a tagged value; a user dict holding this key is stored as a "map"


def is_plain(value: Any) -> bool:
    """True for data the codec stores as is: numbers, strings, None, tensors, and containers."""
    try:
        encode(value, "value")
    except BadInputError:
        return False
    return True


class _Encoder:
    def __init__(self, copy: bool) -> None:
        self.copy = copy
        self.tensors: dict[str, torch.Tensor] = {}
        self._by_id: dict[Any, str] = {}

    def tensor(self, t: torch.Tensor, where: str) -> str:
        # Tied weights: one tensor under two names (a state_dict's detached views of one
        # parameter are distinct objects on one storage) is stored once, so a save from the
        # live module and one from a staged copy (staging.py) write the same bytes.
        same = _identity(t)
        if same in self._by_id:
            return self._by_id[same]
        if _is_dtensor(t):
            raise BadInputError(
                f"{where} is a DTensor (a sharded parameter)",
                "save sharded state with Checkpointer(..., sharded=None or True): it goes "
                "through torch.distributed.checkpoint, one shard file per rank",
            )
        if t.is_sparse or t.is_quantized or t.is_complex():
            raise BadInputError(
                f"{where} is a {t.layout} / {t.dtype} tensor, which safetensors cannot store",
                "store it dense and real (for example torch.view_as_real), or leave it out",
            )
        # A snapshot must not change when training goes on: copy, even on the CPU.
        cpu = t.detach().to("cpu", copy=self.copy).contiguous()
        key = where
        self.tensors[key] = cpu
        self._by_id[same] = key
        return key

    def encode(self, v: Any, where: str) -> Any:
        if v is None or isinstance(v, bool | int | float | str):
            return v
        if isinstance(v, torch.Tensor):
            return {TAG: "tensor", "key": self.tensor(v, where)}
        if isinstance(v, list):
            if all(type(x) in _SCALARS for x in v):  # RNG states, id lists: as they are
                return list(v)
            return [self.encode(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if isinstance(v, tuple):
            return {
                TAG: "tuple",
                "items": [self.encode(x, f"{where}[{i}]") for i, x in enumerate(v)],
            }
        if isinstance(v, dict):
            if all(isinstance(k, str) for k in v) and TAG not in v:
                return {k: self.encode(x, f"{where}.{k}") for k, x in v.items()}
            items = [
                [self.encode(k, f"{where} key {k!r}"), self.encode(x, f"{where}[{k!r}]")]
                for k, x in v.items()
            ]
            return {TAG: "map", "items": items}
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                raise _refuse(v, where)
            return {TAG: "ndarray", "key": self.tensor(torch.from_numpy(v.copy()), where)}
        if isinstance(v, np.generic):
            return {TAG: "np", "dtype": v.dtype.str, "value": v.item()}
        if isinstance(v, torch.dtype):
            return {TAG: "dtype", "name": str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {TAG: "device", "name": str(v)}
        raise _refuse(v, where)


def _refuse(v: Any, where: str) -> BadInputError:
    return BadInputError(
        f"{where} is a {type(v).__module__}.{type(v).__qualname__}, which is neither plain data "
        "(numbers, strings, None, lists, tuples, dicts, tensors, numpy arrays) nor an object with "
        "state_dict()/load_state_dict(); checkpoints never pickle, so it cannot be stored",
        "give the object state_dict()/load_state_dict() methods that return plain data, or "
        "store its plain fields instead of the object",
    )


def _identity(t: torch.Tensor) -> Any:
    """What makes two tensors the same stored value: the same memory, viewed the same way."""
    if _is_dtensor(t) or t.is_sparse or t.is_quantized or not t.numel():
        return id(t)
    storage = t.untyped_storage()
    return (storage.data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t.device)


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"


def encode(value: Any, where: str, copy: bool = False) -> tuple[Any, dict[str, torch.Tensor]]:
    """(JSON skeleton, {key: CPU tensor}) for `value`; BadInputError naming `where` on failure.

    `copy=True` copies every tensor (a snapshot the caller may mutate right after)."""
    enc = _Encoder(copy)
    return enc.encode(value, where), enc.tensors


def _unshare(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses two entries on one storage (views of one buffer): copy the later."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for k, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if t.numel() and key in seen:
            t = t.clone()
        elif t.numel():
            seen.add(key)
        out[k] = t
    return out


def decode(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The value `encode` was given (tensors on the CPU; numpy arrays as numpy)."""
    if isinstance(skeleton, list):
        return [decode(x, tensors) for x in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    tag = skeleton.get(TAG)
    if tag is None:
        return {k: decode(x, tensors) for k, x in skeleton.items()}
    try:
        if tag == "tensor":
            return tensors[skeleton["key"]]
        if tag == "ndarray":
            return tensors[skeleton["key"]].numpy().copy()
        if tag == "tuple":
            return tuple(decode(x, tensors) for x in skeleton["items"])
        if tag == "map":
            return {_hashable(decode(k, tensors)): decode(x, tensors) for k, x in skeleton["items"]}
        if tag == "np":
            return np.dtype(skeleton["dtype"]).type(skeleton["value"])
        if tag == "dtype":
            dtype = getattr(torch, skeleton["name"])
            if not isinstance(dtype, torch.dtype):
                raise TypeError(skeleton["name"])
            return dtype
        if tag == "device":
            return torch.device(skeleton["name"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CorruptError(
            f"checkpoint state is malformed at a {tag!r} entry: {type(e).__name__}: {e}",
            "load another checkpoint; this one was not written by this version of trainguard",
        ) from e
    raise CorruptError(f"checkpoint state has an unknown entry type {tag!r}", "load another step")


def _hashable(k: Any) -> Any:
    return tuple(_hashable(x) for x in k) if isinstance(k, list) else k


def write_state(folder: Path, stem: str, skeleton: Any, tensors: dict[str, torch.Tensor]) -> None:
    """`<stem>.json` and `<stem>.safetensors` in `folder` (the store fsyncs and checksums)."""
    doc, weights = state_files(stem)
    save_file(_unshare(tensors), str(folder / weights))
    (folder / doc).write_text(json.dumps(skeleton, indent=1))


def state_files(stem: str) -> tuple[str, str]:
    """The files `write_state` writes and `read_state` reads."""
    return f"{stem}.json", f"{stem}.safetensors"


def read_state(folder: Path, stem: str) -> Any:
    """The value written by `write_state`, decoded; only files the folder's manifest lists
    are opened (folder.open_listed)."""
    doc, weights = state_files(stem)
    try:
        with open_listed(folder, doc) as f:
            skeleton = json.loads(f.read().decode("utf-8"))
        with listed_path(folder, weights) as path:
            tensors = load_file(path)
    except Exception as e:  # json, OS and safetensors' own error types: all mean "unreadable"
        raise CorruptError(
            f"cannot read {stem}.json / {stem}.safetensors in {folder}: {e}",
            "load another checkpoint",
        ) from e
    return decode(skeleton, tensors)
