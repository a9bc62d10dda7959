"""`trainguard recipes`: the shipped recipes, what each is for, what was tested and where."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from trainguard.cli.common import console, emit


def register(app: typer.Typer) -> None:
    @app.command("recipes")
    def recipes_command(
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """List the shipped recipes: what each is for, its reference curves (full size and CI
        size), and what was tested where. Run one with `trainguard run NAME`."""
        from trainguard.reference.catalog import catalog

        entries = catalog()
        if not as_json:
            for e in entries:
                console.print(
                    f"[bold]{escape(str(e['name']))}[/]: {escape(str(e.get('description', '')))}",
                    markup=True,
                    soft_wrap=True,
                )
                if "purpose" not in e:
                    console.print("  not in the tested library", soft_wrap=True)
                    continue
                console.print(f"  for: {e['purpose']}", markup=False, soft_wrap=True)
                for kind, text in e["tested"].items():
                    console.print(f"  tested ({kind}): {text}", markup=False, soft_wrap=True)
        emit([], as_json, extra={"recipes": entries}, title="recipes")
