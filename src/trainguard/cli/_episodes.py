"""Findings shown as episodes (`findings.group_episodes`): one line per run of consecutive
findings of one code, for the commands that replay or run many steps (`watch`, `run`).

The JSON keeps every finding (`findings`, as before) and adds `episodes` beside it."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from trainguard.cli.common import console, exit_status
from trainguard.findings import Episode, Finding, group_episodes, has_errors

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def episode_where(e: Episode) -> str:
    f = e.first
    count = f" ({e.count} findings)" if e.count > 1 else ""
    rank = f"rank {f.rank}" if f.rank is not None else ""
    return ", ".join(x for x in (e.steps + count, rank, f.metric or "", f.where or "") if x)


def episode_worst(e: Episode) -> str:
    """The worst value when it is not the first finding's (whose message names its own)."""
    if e.worst_step is None or e.worst_step == e.first_step:
        return ""
    return f"worst {e.worst_value} at step {e.worst_step}"


def episodes_table(episodes: list[Episode], title: str = "Findings") -> Table:
    """One row per episode; every value from a finding is escaped (never read as markup)."""
    table = Table(title=title, show_lines=False, expand=False)
    for col in ("code", "severity", "where", "message", "fix"):
        table.add_column(col, overflow="fold")
    for e in episodes:
        style = _SEVERITY_STYLE.get(e.severity, "")
        worst = episode_worst(e)
        message = e.first.message + (f" [{worst}]" if worst else "")
        table.add_row(
            escape(e.code),
            f"[{style}]{escape(e.severity)}[/]",
            escape(episode_where(e)),
            escape(message),
            escape(e.first.fix),
        )
    return table


def episode_counts(episodes: list[Episode], findings: int) -> str:
    """The summary's counts: '1 error and 0 warning episodes, from 50 findings'."""
    n_err = sum(e.severity == "error" for e in episodes)
    n_warn = sum(e.severity == "warning" for e in episodes)
    return f"{n_err} error and {n_warn} warning episodes, from {findings} findings"


def emit_episodes(
    findings: list[Finding],
    as_json: bool,
    extra: dict[str, Any] | None = None,
    title: str = "Findings",
    gap: int = 1,
) -> None:
    """`common.emit` with the findings grouped: JSON `{"ok", "findings", "episodes", ...extra}`
    or one table row per episode; then exit 0 or 1 (error findings)."""
    ok = not has_errors(findings)
    episodes = group_episodes(findings, gap)
    if as_json:
        payload = {
            "ok": ok,
            "findings": [f.to_dict() for f in findings],
            "episodes": [e.to_dict() for e in episodes],
            **(extra or {}),
        }
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    else:
        if episodes:
            console.print(episodes_table(episodes, title))
        verdict = "[bold green]ok[/]" if ok else "[bold red]failed[/]"
        console.print(f"{escape(title)}: {verdict} ({episode_counts(episodes, len(findings))})")
    raise typer.Exit(exit_status(findings))
