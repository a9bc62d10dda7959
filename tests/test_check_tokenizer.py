"""Tokenizer audit: broken tokenizers built here each raise exactly their code; clean ones none."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from trainguard.checks.tokenizer_audit import EOT, audit_tokenizer, check_tokenizer
from trainguard.checks.tokenizer_vocab import byte_decoder
from trainguard.data.tokenizer import train_tokenizer

BYTE = {b: c for c, b in byte_decoder().items()}  # byte -> GPT-2 printable character
CORPUS = ["hello he ll hell", "hello hello, hell he said."]


def byte_bpe(
    merges: list[tuple[str, str]], *, use_regex: bool = True, eot: bool = True
) -> Tokenizer:
    """A byte-level BPE with all 256 bytes, then `merges` in priority order (GPT-2 layout)."""
    vocab: dict[str, int] = {EOT: 0} if eot else {}
    for b in range(256):
        vocab[BYTE[b]] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)
    tok.decoder = decoders.ByteLevel()
    if eot:
        tok.add_special_tokens([EOT])
    tok.encode_special_tokens = True
    return tok


def clean_tok() -> Tokenizer:
    return byte_bpe([("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o")])


def codes(findings) -> set[str]:
    return {f.code for f in findings}


def test_clean_hand_built_tokenizer_raises_nothing():
    packed = np.array([5, 6, 7, 0, 8, 9, 0, 10, 11])
    assert check_tokenizer(clean_tok(), CORPUS, packed_sample=packed) == []


def test_trained_byte_level_bpe_is_clean_but_for_unseen_tokens():
    texts = [
        "def add(a, b):\n    return a + b\n",
        "The quick brown fox jumps over the lazy dog. It was a sunny day.\n",
        "import os\nprint(os.path.join('a', 'b'))  # join two parts\n",
    ] * 20
    tok = train_tokenizer(texts, vocab_size=400, min_frequency=2)
    audit = audit_tokenizer(tok, texts)
    assert codes(audit.findings) <= {"T103"}  # intermediate merges may be absorbed: true unseen
    assert audit.stats["unreachable"] == 0 and audit.stats["round_trip_failures"] == 0
    # Exact counts of every token over the corpus (as from the shards): still no other code.
    ids = np.concatenate([tok.encode(t).ids for t in texts])
    counts = np.bincount(ids, minlength=tok.get_vocab_size())
    assert codes(check_tokenizer(tok, texts, token_counts=counts)) <= {"T103"}


def test_partial_utf8_token_is_undecodable():
    zhong = "中".encode()  # e4 b8 ad
    tok = byte_bpe([(BYTE[zhong[0]], BYTE[zhong[1]])])
    audit = audit_tokenizer(tok)
    assert codes(audit.findings) == {"T101"}
    assert audit.findings[0].data["examples"][0]["bytes"] == "e4b8"


def test_merge_order_makes_a_token_unreachable():
    # "abc" is built as ab+c, but b+c outranks a+b: encoding "abc" gives a, bc and stops.
    tok = byte_bpe([("b", "c"), ("a", "b"), ("ab", "c")])
    audit = audit_tokenizer(tok)
    assert codes(audit.findings) == {"T102"}
    assert [e["token"] for e in audit.findings[0].data["examples"]] == ["abc"]
    assert audit.unreachable_ids == [tok.token_to_id("abc")]


def test_whitespace_fused_after_punctuation():
    tok = byte_bpe([(".", BYTE[ord(" ")]), (":", BYTE[ord("\n")])], use_regex=False)
    findings = check_tokenizer(tok)
    assert codes(findings) == {"T104"}
    assert findings[0].data["count"] == 2
    # Whitespace *before* punctuation (GPT-2's " (") is how ByteLevel splits: not flagged.
    assert check_tokenizer(byte_bpe([(BYTE[ord(" ")], "(")])) == []


def test_tokens_never_seen_in_corpus():
    findings = check_tokenizer(clean_tok(), ["he ll he"])
    assert codes(findings) == {"T103"}
    assert sorted(e["token"] for e in findings[0].data["examples"]) == ["hell", "hello"]


def test_lossy_normaliser_breaks_round_trip():
    tok = clean_tok()
    tok.normalizer = normalizers.Lowercase()
    findings = check_tokenizer(tok, [*CORPUS, "Hello World"])
    assert codes(findings) == {"T105"}
    assert findings[0].severity == "error" and findings[0].data["failures"] == 1


def test_invalid_unicode_documents_are_skipped_not_fatal():
    audit = audit_tokenizer(clean_tok(), [*CORPUS, "caf\udce9"])
    assert audit.findings == [] and audit.stats["corpus_docs_skipped_invalid"] == 1


def test_missing_or_injectable_end_of_text():
    assert codes(check_tokenizer(byte_bpe([("h", "e")], eot=False))) == {"T106"}
    assert check_tokenizer(byte_bpe([("h", "e")], eot=False), eot_token=None) == []
    tok = clean_tok()
    tok.encode_special_tokens = False  # what Tokenizer.from_file gives by default
    assert codes(check_tokenizer(tok)) == {"T109"}


@pytest.mark.parametrize(
    ("sample", "kwargs", "expect"),
    [
        ([5, 6, 0, 0, 7, 8], {}, {"T107"}),  # doubled separator
        ([[5, 6, 7], [8, 9, 10]], {}, {"T107"}),  # no separator at all (a warning)
        ([[5, 6, 0], [7, 8, 0]], {}, set()),
        ([1, 5, 6, 0, 1, 7, 0, 1, 8], {"expect_bos": True}, set()),
        ([1, 5, 6, 0, 7, 8, 0, 1, 8], {"expect_bos": True}, {"T108"}),  # BOS missing
        ([1, 1, 5, 6, 0, 1, 8], {"expect_bos": True}, {"T108"}),  # BOS doubled
        ([1, 5, 6, 0, 1, 7], {"expect_bos": False}, {"T108"}),  # BOS where none expected
        ([5, 6, 0, 7], {"expect_eos": False}, set()),
    ],
)
def test_packed_sample_framing(sample, kwargs, expect):
    tok = clean_tok()
    tok.add_special_tokens(["<|bos|>"])
    bos = tok.token_to_id("<|bos|>")
    arr = np.array(sample)
    arr[arr == 1] = bos
    found = check_tokenizer(tok, packed_sample=arr, bos_token="<|bos|>", **kwargs)
    assert codes(found) == expect


def test_path_loading_and_bad_path(tmp_path):
    from trainguard.errors import BadInputError

    path = tmp_path / "tokenizer.json"
    clean_tok().save(str(path))
    assert check_tokenizer(path, CORPUS) == []
    assert check_tokenizer(tmp_path, CORPUS) == []  # a folder holding tokenizer.json
    with pytest.raises(BadInputError, match="no tokenizer file"):
        check_tokenizer(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(BadInputError, match="not a Hugging Face tokenizer"):
        check_tokenizer(tmp_path / "bad.json")
