"""Rendering and error handling shared by every command: the one place exit statuses are set."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainguard.errors import EXIT_FINDINGS, EXIT_OK, Interrupted, TrainguardError
from trainguard.findings import Finding, has_errors

F = TypeVar("F", bound=Callable[..., Any])

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def handle_errors(fn: F) -> F:
    """Turn trainguard's exceptions (and Ctrl-C or SIGTERM, `errors.Interrupted`) into a clear
    message and the mapped exit status."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (TrainguardError, Interrupted) as e:
            # Messages quote paths and OS errors ("[Errno 28]"): never read them as markup.
            say = err_console.print
            say(f"[bold red]error:[/] {escape(e.message)}", markup=True, soft_wrap=True)
            if e.fix:
                say(f"  [bold]fix:[/] {escape(e.fix)}", markup=True, soft_wrap=True)
            for note in getattr(e, "__notes__", ()):  # e.g. a cleanup that failed after it
                say(f"  [bold]note:[/] {escape(note)}", markup=True, soft_wrap=True)
            raise typer.Exit(e.exit_status) from None

    return wrapper  # type: ignore[return-value]


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
        table.add_row(f.code, f"[{style}]{f.severity}[/]", where, f.message, f.fix)
    return table


def exit_status(findings: list[Finding]) -> int:
    return EXIT_FINDINGS if has_errors(findings) else EXIT_OK


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
        console.print(f"{title}: {verdict} ({n_err} errors, {n_warn} warnings)")
    raise typer.Exit(exit_status(findings))
