"""Verified checkpoints, local and on object storage (see store.py for the contract)."""

from trainguard.checkpoint.results import CheckpointInfo, LoadedCheckpoint, SaveHandle
from trainguard.checkpoint.retry import RetryPolicy, TokenBucket, is_transient
from trainguard.checkpoint.store import CheckpointStore

__all__ = [
    "CheckpointInfo",
    "CheckpointStore",
    "LoadedCheckpoint",
    "RetryPolicy",
    "SaveHandle",
    "TokenBucket",
    "is_transient",
]
