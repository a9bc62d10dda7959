"""Command groups shared by several modules (`trainguard data ...`, `trainguard scale ...`)."""

from __future__ import annotations

import typer

_GROUPS: dict[str, typer.Typer] = {}

_HELP = {
    "data": "Prepare, deduplicate, filter and inspect training data; check it against evals, "
    "check a loader's order and check chat (instruction-tuning) data.",
    "scale": "Gating runs and scaling-law fits that predict a big run's loss.",
    "reference": "Reference curves: a known-good run that later runs are compared with.",
}


def group(app: typer.Typer, name: str) -> typer.Typer:
    """The sub-app `name`, created and attached to `app` on first use."""
    if name not in _GROUPS:
        sub = typer.Typer(help=_HELP.get(name, ""), no_args_is_help=True)
        app.add_typer(sub, name=name)
        _GROUPS[name] = sub
    return _GROUPS[name]
