"""The ranks of a job as the Checkpointer sees them: rank, world, node-local rank, and the few
object collectives it needs, on a gloo group of its own.

The Checkpointer's traffic (the chosen step, every rank's file checksums, RNG states, the
outcome of a save) runs on a dedicated gloo group rather than the default one: the default
group may be nccl (object collectives there need CUDA copies), and an async save talks from a
background thread while the training loop uses the default group. Without torch.distributed
(or with one process) every collective is the identity and nothing touches the network.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch.distributed as dist

from trainguard.errors import BadInputError, StorageError


class RankLostError(StorageError):
    """A collective of a checkpoint operation failed: a rank died or stopped answering."""


def _lost(what: str, error: BaseException) -> RankLostError:
    return RankLostError(
        f"C123: a rank stopped answering during the checkpoint {what} ({type(error).__name__}: "
        f"{error}); nothing was committed, so the interrupted step is never loaded",
        "restart the job; it resumes from the last committed checkpoint. If one rank keeps "
        "dying, look at that rank's log and host",
    )


class CheckpointGroup:
    """This process's place in the job. Creating one is collective when distributed is on."""

    def __init__(self, timeout_s: float = 1800.0) -> None:
        self.active = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.active else 0
        self.size = dist.get_world_size() if self.active else 1
        # torchrun sets LOCAL_RANK / LOCAL_WORLD_SIZE; a job started otherwise is one node.
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.local_size = int(os.environ.get("LOCAL_WORLD_SIZE", self.size))
        self.pg: Any = None
        if self.active:
            # Every rank must call new_group in the same order: the Checkpointer's constructor.
            self.pg = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))

    @property
    def is_node_leader(self) -> bool:
        return self.local_rank == 0

    # A dead peer surfaces as a RuntimeError (gloo: "Connection closed by peer") or a timeout;
    # either way the operation cannot complete on any rank.
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not self.active:
            return obj
        box = [obj]
        try:
            dist.broadcast_object_list(box, src=src, group=self.pg)
        except RuntimeError as e:
            raise _lost("broadcast", e) from e
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.size
        try:
            dist.all_gather_object(out, obj, group=self.pg)
        except RuntimeError as e:
            raise _lost("gather", e) from e
        return out

    def barrier(self) -> None:
        if self.active:
            try:
                dist.barrier(group=self.pg)
            except RuntimeError as e:
                raise _lost("barrier", e) from e

    def agree(self, error: BaseException | None) -> list[tuple[int, str, bool]]:
        """Every rank's failure of a step all ranks took part in: [(rank, text, bad input)],
        empty if none.

        A step that failed on one rank must fail on all, or the ranks drift apart (one waits
        in the next collective while the others train on)."""
        mine = None
        if error is not None:
            mine = (f"{type(error).__name__}: {error}", isinstance(error, BadInputError))
        return [(r, m[0], m[1]) for r, m in enumerate(self.all_gather(mine)) if m is not None]
