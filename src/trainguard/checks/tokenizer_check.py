"""`trainguard check-tokenizer`'s work, callable without the command line: the tokenizer audit
over a corpus sample and a prepared data folder, and with a checkpoint the under-trained tokens
of its embedding (read through the verified loader when it is trainguard's)."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from trainguard.checkpoint.results import LoadedCheckpoint
    from trainguard.findings import Finding


def check_tokenizer(
    tokenizer: Path,
    corpus: str | None = None,
    *,
    text_field: str = "text",
    max_docs: int = 500,
    eot: str = "<|endoftext|>",
    checkpoint: Path | None = None,
    embedding_key: str | None = None,
    prepared: Path | None = None,
    expect_bos: bool = False,
    bos: str | None = None,
) -> tuple[list[Finding], dict[str, Any]]:
    """(findings, extra): `extra["stats"]` the audit's figures, `extra["undertrained"]` with a
    checkpoint whose embedding could be read."""
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
        found, weights = checkpoint_embedding(checkpoint, embedding_key)
        findings = findings + found
        if weights is not None:
            (weight, key), source = weights
            refs = sorted(set(audit.unreachable_ids) | set(audit.unseen_ids))
            f_under, s_under = undertrained_tokens(weight, tok, reference_ids=refs)
            findings = findings + f_under
            extra["undertrained"] = {"embedding_key": key, "checkpoint": source, **s_under}
    return findings, extra


def checkpoint_embedding(
    path: Path, key: str | None
) -> tuple[list[Finding], tuple[tuple[np.ndarray, str], str] | None]:
    """(findings, ((weight, key), source) or None) for --checkpoint.

    A trainguard checkpoint (a step folder, a file inside one, or a run dir) goes through the
    verified loader: a damaged one is a finding, a run dir falls back to the previous valid
    checkpoint, and the embedding comes from its "model" module
    (`checkpoint.read.read_module_state`). Any other safetensors file (a model from
    elsewhere) is read as it is.
    """
    from trainguard.checkpoint.checkpointer_load import LegacyRunCheckpoint, is_legacy_run_step
    from trainguard.checkpoint.inventory import load_error_words, unloadable
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
