"""One module's weights from a sharded (DCP) step, without the module: for `read.py`'s
`read_module_state` (eval, check-tokenizer, the drills). Imports DCP, so it is imported only
for a sharded step (dcp_files.py says why)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from trainguard.checkpoint.dcp_files import METADATA_FILE
from trainguard.checkpoint.dcp_safe import (
    SafeFileSystemReader,
    WeightsOnlyLoadPlanner,
    read_dcp_metadata,
)
from trainguard.errors import BadInputError, CorruptError


def read_sharded_module(folder: Path, key: str) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of module `key` of a verified sharded step, on the CPU:
    buffers sized from DCP's metadata (read through the restricted unpickler), filled by DCP
    in this one process from the shard files the manifest lists."""
    metadata = read_dcp_metadata(Path(folder) / METADATA_FILE)
    prefix = f"{key}."
    state = {
        name[len(prefix) :]: torch.empty(tuple(m.size), dtype=m.properties.dtype)
        for name, m in metadata.state_dict_metadata.items()
        if name.startswith(prefix) and isinstance(m, TensorStorageMetadata)
    }
    if not state:
        raise BadInputError(
            f"sharded checkpoint {folder} holds no module {key!r}",
            "name a module key the checkpoint holds",
        )
    try:
        with warnings.catch_warnings():  # DCP warns that it assumes one process: it does
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(
                {key: state},
                storage_reader=SafeFileSystemReader(str(folder)),
                planner=WeightsOnlyLoadPlanner(),
                no_dist=True,
            )
    except Exception as e:
        raise CorruptError(
            f"cannot read module {key!r} of sharded checkpoint {folder}: {e}",
            "read another checkpoint step",
        ) from e
    return state
