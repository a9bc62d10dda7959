"""Render every recipe key (dotted name, type, default, docstring) as markdown: docs/recipes.md."""

from __future__ import annotations

import typing

from pydantic import BaseModel

from trainguard.config.identity import operational_keys_markdown
from trainguard.config.schema import Recipe


def _type_name(annotation: typing.Any) -> str:
    text = str(annotation).replace("typing.", "")
    return text.removeprefix("<class '").removesuffix("'>")


def _rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        ann = field.annotation
        subs = [a for a in (ann, *typing.get_args(ann)) if isinstance(a, type)]
        section = next((a for a in subs if issubclass(a, BaseModel)), None)
        doc = " ".join((field.description or "").split())
        if section is not None:
            rows.append((key, "section", "", doc))
            rows += _rows(section, key + ".")
        else:
            default = field.get_default(call_default_factory=True)
            rows.append((key, _type_name(ann), repr(default), doc))
    return rows


def render_markdown() -> str:
    lines = [
        "# Recipe keys",
        "",
        "Generated from `trainguard.config.schema` by `python -m trainguard.config > "
        "docs/recipes.md`. Every key can be set in a recipe YAML or with "
        "`trainguard run --set key=value`; unknown keys are rejected, and types are strict: "
        "an int key takes a whole number (not `true`, not `8.0`), a float key a number (not "
        "`true`; `3e-4` as YAML reads it is fine), a bool key `true` or `false` (not `1`).",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for key, kind, default, doc in _rows(Recipe):
        kind, default, doc = (x.replace("|", "/") for x in (kind, default, doc))
        lines.append(f"| `{key}` | {kind} | {default} | {doc} |")
    return "\n".join(lines) + "\n\n" + operational_keys_markdown()
