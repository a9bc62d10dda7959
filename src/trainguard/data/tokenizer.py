"""Byte-level BPE (GPT-2 style) trained with HF `tokenizers` on the train split.

Byte-level means every string is encodable and decode(encode(text)) == text: no unknown
token, no lossy normalisation. `<|endoftext|>` (EOT) separates documents in the packed stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from trainguard.errors import DataError

EOT = "<|endoftext|>"


def _empty_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # add_prefix_space=False: a leading space would change the text and break the round trip.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(
    texts_iterator: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2
) -> Tokenizer:
    """Train a byte-level BPE with `vocab_size` entries (EOT included) on `texts_iterator`.

    Deterministic: HF's BPE trainer breaks count ties by pair ids, so the same texts in the
    same order give the same tokenizer.json bytes (tests check it across processes).
    The vocabulary can end up smaller than `vocab_size` on a tiny corpus (no pair left to merge).
    """
    if vocab_size < 257 + 1:
        raise DataError(
            f"vocab_size={vocab_size} leaves no room beyond the 256 bytes and {EOT}",
            "set tokenizer.vocab_size to 260 or more",
        )
    tok = _empty_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],  # id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes always present
        show_progress=False,
    )
    tok.train_from_iterator(texts_iterator, trainer)
    prepare_for_encoding(tok)
    return tok


def prepare_for_encoding(tok: Tokenizer) -> Tokenizer:
    """Treat a literal "<|endoftext|>" inside a document as text, never as the separator.

    Otherwise a document quoting the marker would inject a fake document boundary (a classic
    tokenizer bug). The setting is not saved in tokenizer.json, so it is applied on load too.
    """
    tok.encode_special_tokens = True
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    return prepare_for_encoding(Tokenizer.from_file(str(path)))


def eot_id(tok: Tokenizer) -> int:
    ident = tok.token_to_id(EOT)
    if ident is None:
        raise DataError(f"tokenizer has no {EOT} token", "train it with train_tokenizer()")
    return ident


def save_tokenizer(tok: Tokenizer, path: str | Path) -> None:
    # Not pretty-printed: fewer bytes to hash, and the same bytes for the same tokenizer.
    Path(path).write_text(tok.to_str(), encoding="utf-8")
