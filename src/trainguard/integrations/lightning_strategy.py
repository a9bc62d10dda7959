"""Which Lightning strategies the guard can judge (`TrainguardLightningCallback.setup` refuses
the others before any step)."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    SingleDeviceStrategy,
)

from trainguard.errors import ConfigError


def check_strategy(strategy: Any) -> None:
    """ConfigError for a strategy the guard cannot judge (checked in `setup`, before any step):
    DeepSpeed keeps the gradients in its engine and steps the optimizer itself; FSDP (version
    1) holds flat local shards whose norm is one rank's; the rest is untested. Guarded: one
    device, DDP."""
    why = None
    if isinstance(strategy, DeepSpeedStrategy):
        why = "DeepSpeed keeps the gradients inside its engine and steps the optimizer itself"
    elif isinstance(strategy, FSDPStrategy):
        why = "FSDP (version 1) holds flat local shards: the gradient norm would be one rank's"
    elif not isinstance(strategy, SingleDeviceStrategy | DDPStrategy):
        why = f"the strategy {type(strategy).__name__} is untested with the guard"
    if why is not None:
        raise ConfigError(
            f"TrainguardLightningCallback cannot guard this run: {why}",
            "train on one device or with strategy='ddp', or without the callback (unguarded)",
        )
