"""`trainguard data check-chat DATA --tokenizer DIR [--template FILE] [--max-length N]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console, emit


def register(app: typer.Typer) -> None:
    data = group(app, "data")

    @data.command("check-chat")
    def data_check_chat(
        data_file: Annotated[
            Path,
            typer.Argument(
                metavar="DATA",
                help='JSON Lines of {"messages": [{"role", "content"}, ...]} or '
                '{"prompt", "response"|"completion"}, optionally with the training side\'s '
                "text or input_ids/labels/position_ids columns.",
            ),
        ],
        tokenizer: Annotated[
            Path,
            typer.Option(
                help="Hugging Face tokenizer folder: tokenizer.json and tokenizer_config.json "
                "with its chat_template (read locally, never downloaded)."
            ),
        ],
        template: Annotated[
            Path | None,
            typer.Option(
                help="The Jinja chat template the training code renders with, compared token "
                "by token with the tokenizer's (default: the data's own text/input_ids)."
            ),
        ] = None,
        max_length: Annotated[
            int | None,
            typer.Option(min=1, help="Training sequence length: responses cut, or lost."),
        ] = None,
        max_examples: Annotated[
            int | None, typer.Option(min=1, help="Check the first N examples only.")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Check chat (instruction-tuning) data against the tokenizer's chat template.

        The training rendering token by token, the loss mask, truncation at --max-length,
        roles and turns, packing (codes D401-D414, each with the example ids)."""
        from trainguard.checks.chat_data import check_chat_file

        report = check_chat_file(
            str(data_file),
            str(tokenizer),
            template_file=str(template) if template is not None else None,
            max_length=max_length,
            max_examples=max_examples,
        )
        if not as_json:
            s = report.stats
            lines = [
                f"{s['examples']} examples; rendering compared on {s['compared']}; labels on "
                f"{s['labeled']}; packed rows {s['packed']}",
                f"truncation at {s['max_length']}: {s['cut']} cut, {s['no_response']} with no "
                "response left"
                if s["max_length"]
                else "truncation: not checked (give --max-length)",
            ]
            for line in lines:
                console.print(line, markup=False, soft_wrap=True)
        emit(report.findings, as_json, extra={"stats": report.stats}, title="data check-chat")
