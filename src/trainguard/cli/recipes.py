"""`trainguard recipes`: the shipped recipes, what each is for, what was tested and where."""

from __future__ import annotations

from typing import Annotated

import typer

from trainguard.cli.common import console, emit, handle_errors


def register(app: typer.Typer) -> None:
    @app.command("recipes")
    @handle_errors
    def recipes_command(
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """List the shipped recipes: what each is for, its reference curves (full size and CI
        size), and what was tested where. Run one with `trainguard run NAME`."""
        from rich.table import Table

        from trainguard.reference.catalog import catalog

        entries = catalog()
        if not as_json:
            table = Table(title="Shipped recipes", show_lines=True)
            for col in ("recipe", "for", "tested", "references"):
                table.add_column(col, overflow="fold")
            for e in entries:
                tested = "\n".join(f"{k}: {v}" for k, v in e.get("tested", {}).items())
                refs = "\n".join(f"{r['file']}: {r['status']}" for r in e.get("references", []))
                what = e.get("purpose") or e.get("description", "")
                table.add_row(e["name"], what, tested or "not in the tested library", refs)
            console.print(table)
        emit([], as_json, extra={"recipes": entries}, title="recipes")
