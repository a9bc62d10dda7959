"""Byte-level BPE: round trips on real stdlib files, EOT handling, determinism."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from trainguard.data.corpus import stdlib_files
from trainguard.data.tokenizer import (
    EOT,
    eot_id,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)
from trainguard.errors import DataError

VOCAB = 400
ROOT = Path(__file__).resolve().parents[1]


def _texts(n: int = 30) -> list[str]:
    # Small real stdlib modules: fast to train on, real code.
    small = [p for _, p in stdlib_files() if 2000 < p.stat().st_size < 8000][:n]
    return [p.read_text("utf-8") for p in small]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return _texts()


@pytest.fixture(scope="module")
def tok(texts: list[str]) -> Tokenizer:
    return train_tokenizer(iter(texts), vocab_size=VOCAB, min_frequency=2)


def test_round_trip_on_real_stdlib_files(tok: Tokenizer, texts: list[str]) -> None:
    unseen = [p.read_text("utf-8") for _, p in stdlib_files()[-5:]]
    for text in texts + unseen:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.get_vocab_size() == VOCAB
    # merges were learned: code compresses below one token per byte
    assert len(tok.encode(texts[0]).ids) < 0.7 * len(texts[0].encode())


def test_any_unicode_round_trips_without_unknown_tokens(tok: Tokenizer) -> None:
    text = "  leading spaces, tabs\t, émoji 🐍, CJK 漢字, NUL \x00 and \r\n line ends "
    assert tok.decode(tok.encode(text).ids) == text


def test_eot_is_one_special_token_and_literal_marker_is_text(tok: Tokenizer) -> None:
    eot = eot_id(tok)
    assert tok.id_to_token(eot) == EOT
    # A document that quotes the marker must not inject a document boundary.
    text = f"print('{EOT}')"
    ids = tok.encode(text).ids
    assert eot not in ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_saved_tokenizer_reloads_with_the_same_behaviour(tok: Tokenizer, tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    save_tokenizer(tok, path)
    again = load_tokenizer(path)
    text = f"x = 1  # {EOT}\n"
    assert again.encode(text).ids == tok.encode(text).ids
    assert eot_id(again) not in again.encode(text).ids


def test_training_is_deterministic_across_processes(tok: Tokenizer, texts: list[str]) -> None:
    assert train_tokenizer(iter(texts), VOCAB, 2).to_str() == tok.to_str()
    code = (
        "import sys\nfrom tests.test_tokenizer import _texts, VOCAB\n"
        "from trainguard.data.tokenizer import train_tokenizer\n"
        "sys.stdout.write(train_tokenizer(iter(_texts()), VOCAB, 2).to_str())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout == tok.to_str()


def test_too_small_vocab_is_bad_input() -> None:
    with pytest.raises(DataError, match="vocab_size=257"):
        train_tokenizer(iter(["abc"]), vocab_size=257)
