"""`trainguard report RUN_DIR`: report.html and report.md of any run record."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli.common import console, err_console


def report(run_dir: Path) -> None:
    """Write the report and say where; warn about the log lines it was made without."""
    from trainguard.report.build import write_report

    skipped: list[str] = []
    html_path, md_path = write_report(run_dir, skipped)
    for line in skipped:
        err_console.print(f"warning: {line}", markup=False, soft_wrap=True)
    console.print(f"wrote {html_path} and {md_path}", markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_command(
        run_dir: Annotated[
            Path,
            typer.Argument(
                help="A run dir with a run record: `trainguard run`'s, or the run_dir of "
                "Guard(run_dir=...), a GuardedTrainer or the Lightning callback."
            ),
        ],
    ) -> None:
        """Regenerate RUN_DIR/report.html and RUN_DIR/report.md from the run record."""
        report(run_dir)
