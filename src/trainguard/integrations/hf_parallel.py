"""Which Trainer parallelisms `GuardedTrainer` guards, checked when it is built.

The guard must see every optimizer step's loss and gradient norm before the update and be able
to skip that update. That holds for one process, DDP (torchrun or `accelerate launch`, CPU or
GPU) and FSDP2 through accelerate (`TrainingArguments(fsdp=..., fsdp_config={"version": 2})`:
the gradients are DTensor shards whose norm is the whole model's on every rank, and a skipped
update leaves every shard as it was). Anything else is refused at start rather than run
unguarded while the guard appears on: DeepSpeed keeps the gradients in its engine and steps
the optimizer itself; FSDP1 holds flat local shards whose norm is one rank's; XLA, Megatron-LM,
a model sharded by transformers itself and other accelerators are untested.
"""

from __future__ import annotations

from typing import Any

from trainguard.errors import ConfigError

SUPPORTED = (
    "one process, DDP (torchrun or accelerate launch) or FSDP2 through accelerate "
    "(TrainingArguments(fsdp=..., fsdp_config={'version': 2}))"
)
GUARDED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "FSDP")


def refusal(
    distributed_type: str,
    *,
    deepspeed: bool = False,
    fsdp_version: int | None = None,
    sharded_by_transformers: bool = False,
) -> str | None:
    """Why this parallelism cannot be guarded, or None when it can."""
    if deepspeed or distributed_type == "DEEPSPEED":
        return (
            "DeepSpeed keeps the gradients inside its engine and steps the optimizer itself: "
            "the guard could neither score the step's gradient norm nor skip its update"
        )
    if distributed_type == "FSDP" and fsdp_version != 2:
        return (
            f"FSDP version {fsdp_version} holds flat local shards: the gradient norm the guard "
            "would score is one rank's, not the model's"
        )
    if sharded_by_transformers:
        return "a model sharded by transformers itself (distributed_config) is untested"
    if distributed_type not in GUARDED_TYPES:
        return f"accelerate's {distributed_type} is untested with the guard"
    return None


def check_parallelism(trainer: Any) -> None:
    """ConfigError (exit 2 under the CLI) naming what is supported, before any step."""
    state = trainer.accelerator.state
    kind = getattr(state.distributed_type, "name", str(state.distributed_type))
    plugin = getattr(state, "fsdp_plugin", None) if kind == "FSDP" else None
    why = refusal(
        kind,
        deepspeed=bool(getattr(trainer, "is_deepspeed_enabled", False)),
        fsdp_version=getattr(plugin, "fsdp_version", None),
        sharded_by_transformers=bool(getattr(trainer, "is_distributed_loading_by_transformers", 0)),
    )
    if why is not None:
        raise ConfigError(
            f"GuardedTrainer cannot guard this run: {why}",
            f"train with {SUPPORTED}, or without GuardedTrainer (the run is then unguarded)",
        )
