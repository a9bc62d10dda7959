"""What the Checkpointer knows about DCP without importing it: the names of DCP's files and
whether a module is sharded.

`import torch.distributed.checkpoint` pulls in DTensor, its sharding rules and sympy: about as
long as `import torch` itself. A single-process run never writes a sharded checkpoint, so a
restart must not pay for it; `dcp_safe.py` and `sharded.py` (which import DCP) are imported
only when a checkpoint is sharded.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

METADATA_FILE = ".metadata"  # DCP's metadata file in a sharded checkpoint's folder


def shard_rank(name: str) -> int | None:
    """The rank that wrote a DCP data file (`__<rank>_<n>.distcp`), else None."""
    if name.startswith("__") and name.endswith(".distcp"):
        head = name[2:].split("_", 1)[0]
        return int(head) if head.isdigit() else None
    return None


def is_sharded_module(module: torch.nn.Module) -> bool:
    """True for an FSDP2 (`fully_shard`) module or any module holding DTensor parameters.

    Neither can exist before its class is imported: while neither `torch.distributed.tensor`
    nor `torch.distributed.fsdp` is loaded the answer is False without importing them."""
    if not {"torch.distributed.tensor", "torch.distributed.fsdp"} & sys.modules.keys():
        return False
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if isinstance(module, FSDPModule):
        return True
    return any(isinstance(t, DTensor) for t in [*module.parameters(), *module.buffers()])
