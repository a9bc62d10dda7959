"""`trainguard check-tokenizer TOKENIZER [--corpus PATH] [--checkpoint PATH] [--json]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli.common import console, emit
from trainguard.data.corpus import ACCEPTED


def register(app: typer.Typer) -> None:
    @app.command("check-tokenizer")
    def check_tokenizer_cmd(
        tokenizer: Annotated[
            Path, typer.Argument(help="A Hugging Face tokenizer.json, or a folder holding one.")
        ],
        corpus: Annotated[
            str | None,
            typer.Option(
                help=f"Training text ({ACCEPTED}) for unseen tokens and the text round trip; "
                "documents that are not valid Unicode are set aside, as training does."
            ),
        ] = None,
        text_field: Annotated[str, typer.Option(help="Text field of JSONL/Parquet.")] = "text",
        max_docs: Annotated[int, typer.Option(min=1, help="Corpus documents to read.")] = 500,
        eot: Annotated[str, typer.Option(help="End-of-text token.")] = "<|endoftext|>",
        checkpoint: Annotated[
            Path | None,
            typer.Option(
                help="A trained checkpoint (run dir or step folder) or a safetensors file: "
                "list under-trained tokens (T110)."
            ),
        ] = None,
        embedding_key: Annotated[
            str | None, typer.Option(help="Tensor name of the (vocab, dim) embedding.")
        ] = None,
        prepared: Annotated[
            Path | None,
            typer.Option(
                help="A prepared data folder (`data prepare`): count tokens over its train "
                "split exactly and check document framing in its packed stream."
            ),
        ] = None,
        expect_bos: Annotated[bool, typer.Option(help="Documents must start with --bos.")] = False,
        bos: Annotated[str | None, typer.Option(help="Beginning-of-sequence token.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Audit a tokenizer: vocabulary round trip, unseen tokens, whitespace merges, text
        round trip, end-of-text handling; with --checkpoint, under-trained tokens."""
        from trainguard.checks.tokenizer_check import check_tokenizer

        findings, extra = check_tokenizer(
            tokenizer,
            corpus,
            text_field=text_field,
            max_docs=max_docs,
            eot=eot,
            checkpoint=checkpoint,
            embedding_key=embedding_key,
            prepared=prepared,
            expect_bos=expect_bos,
            bos=bos,
        )
        if not as_json:
            console.print(
                ", ".join(f"{k}={v}" for k, v in extra["stats"].items()),
                soft_wrap=True,
                markup=False,
            )
        emit(findings, as_json, extra=extra, title="check-tokenizer")
