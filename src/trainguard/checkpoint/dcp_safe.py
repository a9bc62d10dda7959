"""torch.distributed.checkpoint (DCP) without unpickling untrusted bytes, and the module-optimizer
pairing as torchtitan makes it.

DCP writes its `.metadata` with `pickle.dump` and reads it with a bare `pickle.load`: a planted
file runs any code it likes on load. `SafeFileSystemReader` reads it through an unpickler that
admits only DCP's own metadata classes and the few torch values they hold (dtypes, sizes,
layouts); anything else (os.system, builtins.eval, subprocess...) is refused. DCP also stores
non-tensor leaves (an optimizer's lr, betas) as torch.save blobs that its default planner loads
with `weights_only=False`; `WeightsOnlyLoadPlanner` loads them with `weights_only=True`. Tensor
data itself DCP already reads with `weights_only=True`.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import pickle
from collections.abc import Iterator
from typing import Any

import torch
import xxhash
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner uses
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from trainguard.checkpoint.folder import listed_files, open_listed
from trainguard.errors import CorruptError

# DCP's own metadata types, by (module, name). Classes only: constructing one runs no code.
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
    )
    if hasattr(dcp_metadata, name)
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # maps "torch.strided" to the layout object
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class UnsafeCheckpointError(CorruptError):
    """A checkpoint file would run code or build objects that are not plain checkpoint data."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            if module == "pathlib":
                return getattr(pathlib, name)
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"refused to load {module}.{name}: not part of DCP's checkpoint metadata"
        )


def read_dcp_metadata(path: pathlib.Path) -> Metadata:
    """DCP's metadata from `path`, a file its step folder's manifest lists (read through
    folder.open_listed), or UnsafeCheckpointError if it is anything else."""
    try:
        with open_listed(path.parent, path.name) as f:
            raw = f.read()
        obj = _MetadataUnpickler(io.BytesIO(raw)).load()
    except Exception as e:  # any malformed or hostile pickle: refuse, never half-load
        raise UnsafeCheckpointError(
            f"{path} is not plain DCP metadata: {type(e).__name__}: {e}",
            "do not load this checkpoint; it may have been tampered with. Load another step",
        ) from e
    if not isinstance(obj, Metadata):
        raise UnsafeCheckpointError(
            f"{path} holds a {type(obj).__name__}, not DCP metadata",
            "do not load this checkpoint; load another step",
        )
    return obj


class _ListedFileSystem(FileSystem):
    """DCP's file access for reading a verified step folder: only files its manifest lists,
    regular files inside it (folder.open_listed); DCP's metadata names the shard files, and
    an unlisted or linked one is refused, never opened."""

    def __init__(self, folder: pathlib.Path) -> None:
        super().__init__()
        self.folder = folder
        self.files: dict[str, dict[str, Any]] | None = None

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        if mode != "rb":
            raise ValueError(f"a checkpoint being loaded is read only (mode {mode!r})")
        if self.files is None:
            self.files = listed_files(self.folder)
        name = pathlib.PurePath(path).relative_to(self.folder).as_posix()
        with open_listed(self.folder, name, self.files) as stream:
            yield stream


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose metadata goes through the restricted unpickler and whose files
    are opened only if the folder's manifest lists them."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path)
        self.fs = _ListedFileSystem(pathlib.Path(path))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        metadata = read_dcp_metadata(pathlib.Path(self._get_metadata_path(rank)))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that loads non-tensor leaves with torch.load(weights_only=True)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._nested_dict import FLATTEN_MAPPING  # noqa: F401

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class _HashingStream:
    """A write stream that checksums what passes through it (DCP writes shards sequentially:
    `write`, `tell`, `flush`, `fileno` for the fsync, `close`)."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.hash, self.size = raw, xxhash.xxh3_128(), 0

    def write(self, b: Any) -> int:
        n = self.raw.write(b)
        self.hash.update(b)
        self.size += len(memoryview(b).cast("B"))
        return n

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, close, ...
        return getattr(self.raw, name)


class _HashingFileSystem(FileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.checksums: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as raw:
            stream = _HashingStream(raw)
            yield stream
        name = pathlib.Path(path).name
        self.checksums[name] = {"size": stream.size, "checksum": stream.hash.hexdigest()}


class HashingFileSystemWriter(FileSystemWriter):
    """DCP's FileSystemWriter that checksums each file while writing it, so a rank need not
    read its shards back to report them for the manifest. `checksums` maps file names to
    {"size", "checksum"}; a file missing there (a DCP version that writes differently) is
    checksummed by reading it."""

    def __init__(self, path: str) -> None:
        super().__init__(path, sync_files=True)
        self.fs = _HashingFileSystem()

    @property
    def checksums(self) -> dict[str, dict[str, Any]]:
        return self.fs.checksums


class ModelState(Stateful):
    """A module's (possibly FSDP2-sharded) state for DCP: DTensor shards, keyed by FQN."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state_dict)


class OptimizerState(Stateful):
    """An optimizer's state keyed by parameter FQN, which needs the module it trains: the
    pairing is explicit so a resume on another world size (resharding) finds every entry."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state_dict)
