"""Verified checkpoints, local and on object storage (see store.py for the contract)."""

from trainguard.checkpoint.retry import RetryPolicy, TokenBucket, is_transient
from trainguard.checkpoint.store import (
    CheckpointInfo,
    CheckpointStore,
    LoadedCheckpoint,
    SaveHandle,
)

__all__ = [
    "CheckpointInfo",
    "CheckpointStore",
    "LoadedCheckpoint",
    "RetryPolicy",
    "SaveHandle",
    "TokenBucket",
    "is_transient",
]
