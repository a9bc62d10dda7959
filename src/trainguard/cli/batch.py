"""`trainguard batch RUN_DIR --step N [--json] [--html OUT]`: the global batch behind a step."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli.common import console, emit, err_console


def register(app: typer.Typer) -> None:
    @app.command("batch")
    def batch(
        run_dir: Annotated[Path, typer.Argument(help="The run dir of a `trainguard run`.")],
        step: Annotated[int, typer.Option("--step", help="The step (0-based, as logged).")],
        html: Annotated[
            Path | None, typer.Option("--html", help="Also write the batch as an HTML page.")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Decode the global batch of a step: sample ids from the logged position in the
        elastic order, the documents and offsets they come from, the text, what the data
        filters flag in them, and each sample's loss from the newest checkpoint at or before
        the step before."""
        from trainguard.reference.record import run_inputs
        from trainguard.report.batch import decode_batch
        from trainguard.util.atomic import atomic_write_text, check_writable
        from trainguard.util.paths import refuse_overwrite

        if html is not None:
            refuse_overwrite({"--html": html}, run_inputs(run_dir))  # before reading anything
            check_writable(html)
        skipped: list[str] = []
        try:
            view = decode_batch(run_dir, step, skipped)
        finally:  # damaged log lines the batch was looked up without, said even when it fails
            for line in skipped:
                err_console.print(f"warning: {line}", markup=False, soft_wrap=True)
        if html is not None:
            from trainguard.report.build import render_batch_html

            atomic_write_text(html, render_batch_html(view, run_dir))
        if not as_json:
            console.print(
                f"step {view.step}: position {view.position}, {len(view.samples)} samples"
                + (
                    f", losses from the checkpoint of step {view.loss_from_step}"
                    if view.loss_from_step is not None
                    else ", no checkpoint at or before the step before it: no losses"
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
                console.print("     " + repr(s["text"][:160]), markup=False)
        extra = view.to_dict() | ({"html": str(html)} if html is not None else {})
        emit(view.findings, as_json, extra=extra, title=f"batch of step {step}")
