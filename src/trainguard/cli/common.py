"""Rendering and error handling shared by every command: the one place exit statuses are set.

`exit_statuses` is the one handler from exceptions to exit statuses (`errors.ExitStatus`): the
app's group (`TrainguardGroup`) runs every command inside it, so a command never catches
trainguard's errors itself. `emit` ends a check command with 0 or 1.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from trainguard.errors import ExitStatus, TrainguardError, exit_status_for
from trainguard.findings import Finding, has_errors

# Markup is off by default: what the commands print is mostly user strings (paths, column and
# recipe names, messages) and "[/x]" in any of them would be read as a tag (a MarkupError
# traceback, or text restyled). A print that means markup says so (`markup=True`) and escapes
# every value it interpolates; table cells and titles are plain text.
console = Console(stderr=False, highlight=False, markup=False)
err_console = Console(stderr=True, highlight=False, markup=False)

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


@contextlib.contextmanager
def exit_statuses(traceback: bool = False) -> Iterator[None]:
    """Turn trainguard's exceptions, and Ctrl-C or SIGTERM (`errors.Interrupted`, a
    KeyboardInterrupt), into their message and exit status (`errors.exit_status_for`).

    `traceback` (the global `--traceback` flag, for developers): re-raise instead, so that the
    interpreter prints the traceback. Any other exception is a bug and keeps its traceback.
    """
    try:
        yield
    except (TrainguardError, KeyboardInterrupt) as e:
        if traceback:
            raise
        # Messages quote paths and OS errors ("[Errno 28]"): never read them as markup.
        say = err_console.print
        message = getattr(e, "message", None) or "interrupted"
        say(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)
        if getattr(e, "fix", ""):
            say(f"  [bold]fix:[/] {escape(e.fix)}", markup=True, soft_wrap=True)
        for note in getattr(e, "__notes__", ()):  # e.g. a cleanup that failed after it
            say(f"  [bold]note:[/] {escape(note)}", markup=True, soft_wrap=True)
        raise typer.Exit(exit_status_for(e)) from None


class TrainguardGroup(TyperGroup):
    """The `trainguard` app: every command (and every sub-group's) runs in `exit_statuses`."""

    def invoke(self, ctx: click.Context) -> Any:
        with exit_statuses(traceback=bool(ctx.params.get("traceback"))):
            return super().invoke(ctx)


def findings_table(findings: list[Finding], title: str = "Findings") -> Table:
    table = Table(title=title, show_lines=False, expand=False)
    for col in ("code", "severity", "where", "message", "fix"):
        table.add_column(col, overflow="fold")
    for f in findings:
        where = ", ".join(
            x
            for x in (
                f"step {f.step}" if f.step is not None else "",
                f"rank {f.rank}" if f.rank is not None else "",
                f.metric or "",
                f.where or "",
            )
            if x
        )
        style = _SEVERITY_STYLE.get(f.severity, "")
        table.add_row(f.code, Text(f.severity, style=style), where, f.message, f.fix)
    return table


def exit_status(findings: list[Finding]) -> ExitStatus:
    """FINDINGS when a finding is an error, else OK."""
    return ExitStatus.FINDINGS if has_errors(findings) else ExitStatus.OK


def emit(
    findings: list[Finding],
    as_json: bool,
    extra: dict[str, Any] | None = None,
    title: str = "Findings",
) -> None:
    """Print `{"ok", "findings", ...extra}` as JSON or a table, then exit 0 or 1."""
    ok = not has_errors(findings)
    if as_json:
        payload = {"ok": ok, "findings": [f.to_dict() for f in findings], **(extra or {})}
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    else:
        if findings:
            console.print(findings_table(findings, title))
        verdict = "[bold green]ok[/]" if ok else "[bold red]failed[/]"
        n_err = sum(f.severity == "error" for f in findings)
        n_warn = sum(f.severity == "warning" for f in findings)
        console.print(
            f"{escape(title)}: {verdict} ({n_err} errors, {n_warn} warnings)", markup=True
        )
    raise typer.Exit(exit_status(findings))
