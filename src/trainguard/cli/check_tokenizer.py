"""`trainguard check-tokenizer TOKENIZER [--corpus PATH] [--checkpoint PATH] [--json]`."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from trainguard.cli.common import console, emit
from trainguard.data.corpus import ACCEPTED

if TYPE_CHECKING:
    import numpy as np

    from trainguard.checkpoint.results import LoadedCheckpoint
    from trainguard.findings import Finding


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
        from trainguard.checks.tokenizer_audit import audit_tokenizer, load_tokenizer_file
        from trainguard.checks.undertrained import undertrained_tokens
        from trainguard.data.corpus import iter_documents

        tok = load_tokenizer_file(tokenizer)
        texts = None
        if corpus is not None:
            texts = [d.text for d in islice(iter_documents(corpus, text_field), max_docs)]
        counts = packed = None
        if prepared is not None:
            from trainguard.checks.data_preflight import token_counts
            from trainguard.data.prepare import PreparedData

            data = PreparedData.from_dir(prepared)
            counts = token_counts(data.train, tok.get_vocab_size(with_added_tokens=True))
            packed = data.train.tokens(0, min(int(data.train.n_tokens), 1 << 20))
        audit = audit_tokenizer(
            tok,
            texts,
            eot_token=eot,
            max_docs=max_docs,
            token_counts=counts,
            packed_sample=packed,
            expect_bos=expect_bos,
            bos_token=bos,
        )
        findings, extra = audit.findings, {"stats": audit.stats}
        if checkpoint is not None:
            found, weights = _checkpoint_embedding(checkpoint, embedding_key)
            findings = findings + found
            if weights is not None:
                (weight, key), source = weights
                refs = sorted(set(audit.unreachable_ids) | set(audit.unseen_ids))
                f_under, s_under = undertrained_tokens(weight, tok, reference_ids=refs)
                findings = findings + f_under
                extra["undertrained"] = {"embedding_key": key, "checkpoint": source, **s_under}
        if not as_json:
            console.print(
                ", ".join(f"{k}={v}" for k, v in audit.stats.items()), soft_wrap=True, markup=False
            )
        emit(findings, as_json, extra=extra, title="check-tokenizer")


def _checkpoint_embedding(
    path: Path, key: str | None
) -> tuple[list[Finding], tuple[tuple[np.ndarray, str], str] | None]:
    """(findings, ((weight, key), source) or None) for --checkpoint.

    A trainguard checkpoint (a step folder, a file inside one, or a run dir) goes through the
    verified loader: a damaged one is a finding, a run dir falls back to the previous valid
    checkpoint, and the embedding comes from its "model" module
    (`checkpoint.read.read_module_state`). Any other safetensors file (a model from
    elsewhere) is read as it is.
    """
    from trainguard.checkpoint.inventory import load_error_words, unloadable
    from trainguard.checkpoint.loading import LegacyRunCheckpoint, is_legacy_run_step
    from trainguard.checkpoint.read import STATE_TENSORS, read_module_state
    from trainguard.checkpoint.target import is_checkpoint_folder, open_checkpoint
    from trainguard.checks.undertrained import embedding_from_state, load_embedding
    from trainguard.errors import TrainguardError

    folder = path.parent if path.is_file() else path
    run_dir = path.is_dir() and (
        (path / "checkpoints").is_dir() or (path / "recipe.yaml").is_file()
    )
    if not (is_checkpoint_folder(folder) or run_dir):
        return [], (load_embedding(path, key), str(path))
    got: dict[str, tuple[np.ndarray, str]] = {}

    def usable(loaded: LoadedCheckpoint) -> list[Finding]:
        if is_legacy_run_step(loaded.manifest):
            owner = path if run_dir else loaded.path.parent.parent
            raise LegacyRunCheckpoint(loaded.step, str(loaded.path.parent), str(owner))
        try:
            state = read_module_state(loaded.path, "model")
        except TrainguardError as e:
            return [unloadable(loaded.step, loaded.path, STATE_TENSORS, load_error_words(e))]
        got["weights"] = embedding_from_state(state, key, f"checkpoint {loaded.path}")
        return []

    loaded, findings = open_checkpoint(folder if path.is_file() else path, usable)
    if loaded is None:
        return findings, None
    return findings, (got["weights"], str(loaded.path))
