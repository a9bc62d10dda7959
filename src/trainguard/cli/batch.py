"""`trainguard batch RUN_DIR --step N [--describe module:function] [--json] [--html OUT]`: the
global batch behind a step of any run record."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli.common import console, emit, err_console

DESCRIBE_FORMAT = (
    "give --describe as path/to/file.py:function or package.module:function, a function of "
    'one sample id returning its text (or {"text": ..., "loss": ...})'
)


def show_batch(run_dir: Path, step: int, html: Path | None, describe: str | None, as_json: bool):
    """Decode, print (text or JSON), and write the page when asked."""
    from trainguard.reference.record import run_inputs
    from trainguard.report.batch import decode_batch
    from trainguard.util.atomic import atomic_write_text, check_writable
    from trainguard.util.paths import refuse_overwrite

    if html is not None:
        refuse_overwrite({"--html": html}, run_inputs(run_dir))  # before reading anything
        check_writable(html)
    function = None
    if describe is not None:  # bad input before anything is read: exit 2 naming the fix
        from trainguard.checks.model_target import load_callable

        function = load_callable(describe, "--describe", DESCRIBE_FORMAT, kind="function")
    skipped: list[str] = []
    try:
        view = decode_batch(run_dir, step, skipped, function, describe or "")
    finally:  # damaged log lines the batch was looked up without, said even when it fails
        for line in skipped:
            err_console.print(f"warning: {line}", markup=False, soft_wrap=True)
    if html is not None:
        from trainguard.report.build import render_batch_html

        atomic_write_text(html, render_batch_html(view, run_dir))
    if not as_json:
        _print(view)
    extra = view.to_dict() | ({"html": str(html)} if html is not None else {})
    emit(view.findings, as_json, extra=extra, title=f"batch of step {step}")


def _print(view) -> None:  # noqa: ANN001 - a report.batch.BatchView
    where = f"position {view.position}" if view.position is not None else "position unknown"
    console.print(
        f"step {view.step} ({view.loop}): {where}, {len(view.samples)} samples"
        + (
            f", losses from the checkpoint of step {view.loss_from_step}"
            if view.loss_from_step is not None
            else ""
        ),
        markup=False,
    )
    for s in view.samples:
        loss = f"{s['loss']:.4f}" if s["loss"] is not None else "-"
        docs = ", ".join(f"doc {d['doc']}+{d['offset']}" for d in s["documents"])
        flags = " ".join(sorted({f["code"] for f in s["flags"]}))
        console.print(
            f"{s['index']:4d} id {s['sample_id']:<8d} loss {loss:>8s}  {docs}  {flags}",
            markup=False,
        )
        if s["text"] is not None:
            console.print("     " + repr(s["text"][:160]), markup=False)
    for line in view.not_shown:
        console.print(f"not shown: {line}", markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    @app.command("batch")
    def batch(
        run_dir: Annotated[
            Path,
            typer.Argument(
                help="A run dir with a run record (`trainguard run`, Guard(run_dir=...), a "
                "GuardedTrainer, the Lightning callback)."
            ),
        ],
        step: Annotated[int, typer.Option("--step", help="The step (0-based, as recorded).")],
        describe: Annotated[
            str | None,
            typer.Option(
                "--describe",
                help="module:function (or file.py:function) mapping a sample id to its text, "
                'or to {"text": ..., "loss": ...}: what your own loop\'s samples hold.',
            ),
        ] = None,
        html: Annotated[
            Path | None, typer.Option("--html", help="Also write the batch as an HTML page.")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Decode the global batch of a step: its sample ids from the recorded sampler and
        position, and what it can show of them (for `trainguard run`: the documents, text,
        filter flags and per-sample losses; for your own loop: what --describe returns),
        saying what it could not show and why."""
        show_batch(run_dir, step, html, describe, as_json)
