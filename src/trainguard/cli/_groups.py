"""Command groups shared by several modules (`trainguard data ...`, `trainguard scale ...`)."""

from __future__ import annotations

import typer

_HELP = {
    "data": "Prepare, deduplicate, filter and inspect training data; check it against evals, "
    "check a loader's order and check chat (instruction-tuning) data.",
    "scale": "Gating runs and scaling-law fits that predict a big run's loss.",
    "checkpoint": "Checkpoints of a run dir: convert an earlier release's to the one format.",
    "reference": "Reference curves: a known-good run that later runs are compared with.",
}


def group(app: typer.Typer, name: str) -> typer.Typer:
    """The sub-app `name` of `app`, created and attached on first use. Looked up on `app` itself,
    not in a cache of this module: a process may build more than one app (`trainguard.cli.main`
    builds one with the invoked command only, `trainguard.cli.app` has them all)."""
    for info in app.registered_groups:
        if info.name == name and info.typer_instance is not None:
            return info.typer_instance
    sub = typer.Typer(help=_HELP.get(name, ""), no_args_is_help=True)
    app.add_typer(sub, name=name)
    return sub
