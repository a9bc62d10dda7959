"""Strict values: nothing is taken without a word.

`StrictModel` is the base of every config section (the recipe, the guards, the evals): pydantic
strict mode, so a boolean is never an integer or a number (`--set train.max_steps=true` would
otherwise train one step), a float is never an integer (8.5 or 8.0 for a count), and `1` or
`"yes"` is never a boolean. The one conversion kept: a string that spells a number is read as a
float for float fields, because YAML 1.1 (PyYAML) reads `3e-4` as a string; recipes and
`--set train.lr=3e-4` write learning rates that way.

`int_arg` checks the integers public API calls take (`ElasticSampler`, its steps) at the
boundary, so a wrong type is a `ConfigError` naming the argument instead of a
`TypeError` from deep inside, and a float is refused rather than truncated.
"""

from __future__ import annotations

import numbers
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from trainguard.errors import ConfigError


def _takes_float(annotation: Any) -> bool:
    """Whether a field annotated `annotation` holds a float (`float`, `float | None`)."""
    if annotation is float:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return float in typing.get_args(annotation)
    return False


class StrictModel(BaseModel):
    """Pydantic strict mode, with YAML 1.1's number strings read as floats (module doc)."""

    model_config = ConfigDict(strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _float_from_yaml_string(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _takes_float(field.annotation):
                try:
                    return float(value)
                except ValueError:
                    return value  # not a number: strict validation names the key
        return value


def int_arg(
    name: str, value: Any, *, low: int | None = None, high: int | None = None, fix: str = ""
) -> int:
    """`value` as an int when it is an integer (Python's or numpy's) within [low, high];
    else ConfigError naming `name`. Booleans and floats are refused, never converted."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(
            f"{name} must be an integer, got {type(value).__name__} {value!r:.60}",
            fix or f"pass an int as {name}",
        )
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            bounds = f"at least {low}"
        elif low is None:
            bounds = f"at most {high}"
        else:
            bounds = f"in {low}..{high}"
        raise ConfigError(f"{name} must be {bounds}, got {value}", fix or f"pass {name} {bounds}")
    return value


def optional_int_arg(name: str, value: Any, **kw: Any) -> int | None:
    """`int_arg`, with None passed through."""
    return None if value is None else int_arg(name, value, **kw)
