"""The `Guard`'s arguments, checked at its public boundary.

A wrong type is a `ConfigError` naming the argument (exit 2 under the CLI), never a bare
`TypeError` or `AttributeError` from deep inside a detector. The per-step check reads only a
tensor's shape, never its value: it adds no host sync to the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from trainguard.errors import ConfigError
from trainguard.guard.config import GuardsConfig


def guards_config(config: Any) -> GuardsConfig:
    """`Guard(config=...)`: a GuardsConfig, a mapping of its fields (validated into one), or
    None (the defaults)."""
    if config is None:
        return GuardsConfig()
    if isinstance(config, GuardsConfig):
        return config
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"Guard(config=...) must be a GuardsConfig or a dict of its fields, got "
            f"{type(config).__name__}",
            "pass trainguard.guard.config.GuardsConfig(...) or a dict such as {'spike_window': 64}",
        )
    try:
        return GuardsConfig.model_validate(dict(config))
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or '(config)'}: {err['msg']} "
            f"(got {err.get('input')!r:.60})"
            for err in e.errors()
        )
        raise ConfigError(
            f"Guard(config=...) is not a valid GuardsConfig: {problems}",
            "use the fields of the recipe's guards section: "
            + ", ".join(GuardsConfig.model_fields),
        ) from None


def actions_arg(actions: Any) -> Mapping[str, Any]:
    """`Guard(actions=...)`: a mapping of finding codes to actions (or None)."""
    if actions is None:
        return {}
    if not isinstance(actions, Mapping):
        raise ConfigError(
            f"Guard(actions=...) must be a dict of finding codes to actions, got "
            f"{type(actions).__name__}",
            "pass e.g. actions={'R102': 'apply'}",
        )
    return actions


def metric_arg(name: str, value: Any) -> Any:
    """A step metric as the guard takes it: None, a one-element tensor (left where it is: only
    its element count is read, no sync), or a number as a Python float. Strings and booleans
    are refused: `loss="abc"` or `loss=True` is a bug in the loop, not a loss."""
    if value is None:
        return None
    if hasattr(value, "detach"):  # a torch tensor
        if value.numel() != 1:
            raise ConfigError(
                f"guard step: {name} must be a number or a one-element tensor, got a tensor of "
                f"shape {tuple(value.shape)}",
                f"pass the step's single {name} (e.g. the mean loss, loss.mean())",
            )
        return value
    if not isinstance(value, str | bytes | bool):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise ConfigError(
        f"guard step: {name} must be a number or a one-element tensor, got "
        f"{type(value).__name__} {value!r:.60}",
        f"pass {name} as a float or a tensor",
    )


def metric_float(name: str, x: Any) -> float | None:
    """A step metric as a Python float (a tensor read with one deliberate host sync)."""
    x = metric_arg(name, x)
    if hasattr(x, "detach"):
        return float(x.detach().float().cpu().item())
    return x


def device_of(*values: Any, model: Any = None) -> Any:
    """Where a step's metrics live: the first tensor's device, else the model's, else "cpu"."""
    for v in values:
        if hasattr(v, "device"):
            return v.device
    if model is not None:
        for p in model.parameters():
            return p.device
    return "cpu"


def state_arg(state: Any) -> Mapping[str, Any]:
    """`Guard.load_state_dict(state)`: a mapping, as `Guard.state_dict()` returns."""
    if not isinstance(state, Mapping):
        raise ConfigError(
            f"Guard.load_state_dict(state): state must be the dict Guard.state_dict() "
            f"returned, got {type(state).__name__}",
            "pass the guard's state as saved in the checkpoint (state['guard'])",
        )
    return state
