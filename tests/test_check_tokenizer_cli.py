"""Under-trained tokens on really trained embeddings (T110), and the check-tokenizer command."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import normalizers
from typer.testing import CliRunner

from test_check_tokenizer import CORPUS, byte_bpe, clean_tok
from trainguard.checks.undertrained import undertrained_tokens
from trainguard.cli import app

runner = CliRunner()
V, D, USED = 80, 16, 60
STEPS = 100


def train_embedding(vocab: int, used: int, dim: int) -> torch.Tensor:
    """A tied embedding trained on a stream that never contains tokens used..vocab-1."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add contention
    try:
        emb = torch.nn.Parameter(torch.randn(vocab, dim) * 0.02)
        mix = torch.nn.Linear(dim, dim)
        opt = torch.optim.AdamW([emb, *mix.parameters()], lr=3e-2, weight_decay=0.0)
        successor = torch.randint(0, used, (used,))
        for _ in range(STEPS):
            x = torch.randint(0, used, (256,))
            y = (successor[x] + torch.randint(0, 3, (256,))) % used
            logits = torch.tanh(mix(emb[x])) @ emb.T  # (B, V): tied unembedding
            loss = torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)  # leave the session's setting as it was
    return emb.detach()


@pytest.fixture(scope="module")
def trained_embedding() -> torch.Tensor:
    return train_embedding(V, USED, D)


def test_unused_tokens_found_from_a_few_known_ones(trained_embedding):
    findings, stats = undertrained_tokens(trained_embedding, reference_ids=range(USED, USED + 5))
    assert [f.code for f in findings] == ["T110"]
    assert sorted(t["id"] for t in findings[0].data["tokens"]) == list(range(USED, V))
    assert stats["reference_coherence"] > 0.9


def test_unused_tokens_found_without_references(trained_embedding):
    findings, _ = undertrained_tokens(trained_embedding)
    assert sorted(t["id"] for t in findings[0].data["tokens"]) == list(range(USED, V))


def test_trained_tokens_raise_nothing(trained_embedding):
    used = trained_embedding[:USED]
    assert undertrained_tokens(used)[0] == []
    # Arbitrary trained tokens as "references" are no coherent cluster: nothing flagged.
    assert undertrained_tokens(used, reference_ids=range(10))[0] == []


def test_cli_clean_json(tmp_path):
    tok_path = tmp_path / "tokenizer.json"
    clean_tok().save(str(tok_path))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    res = runner.invoke(app, ["check-tokenizer", str(tok_path), "--corpus", str(corpus), "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["ok"] is True and payload["findings"] == []
    assert payload["stats"]["vocab_size"] == 261 and payload["stats"]["round_trip_failures"] == 0


def test_cli_errors_exit_1_and_warnings_0(tmp_path):
    tok = clean_tok()
    tok.normalizer = normalizers.Lowercase()
    tok.save(str(tmp_path / "lossy.json"))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "Hello hello he ll hell"}) + "\n")
    res = runner.invoke(
        app, ["check-tokenizer", str(tmp_path / "lossy.json"), "--corpus", str(corpus), "--json"]
    )
    assert res.exit_code == 1, res.output
    assert [f["code"] for f in json.loads(res.stdout)["findings"]] == ["T105"]
    byte_bpe([("b", "c"), ("a", "b"), ("ab", "c")]).save(str(tmp_path / "unreach.json"))
    res = runner.invoke(app, ["check-tokenizer", str(tmp_path / "unreach.json")])
    assert res.exit_code == 0, res.output
    assert "T102" in res.stdout
    res = runner.invoke(app, ["check-tokenizer", str(tmp_path / "missing.json")])
    assert res.exit_code == 2


def test_cli_checkpoint_lists_undertrained_tokens(tmp_path):
    # EOT and the 256 byte tokens occur in training; the 20 merges "ab".."au" never do (the
    # corpus has no such pair): they are the known-unused references and come out under-trained.
    tok = byte_bpe([("a", c) for c in "bcdefghijklmnopqrstu"])
    tok.save(str(tmp_path / "tok.json"))
    n = tok.get_vocab_size()
    emb = train_embedding(n, 257, 32)
    save_file(
        {"tok_emb.weight": emb, "head.weight": torch.zeros(3, 3)},
        str(tmp_path / "model.safetensors"),
    )
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "hello world"}) + "\n")
    res = runner.invoke(
        app,
        [
            "check-tokenizer",
            str(tmp_path / "tok.json"),
            "--corpus",
            str(corpus),
            "--checkpoint",
            str(tmp_path),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    t110 = [f for f in payload["findings"] if f["code"] == "T110"]
    assert sorted(t["id"] for t in t110[0]["data"]["tokens"]) == list(range(257, n))
    assert payload["undertrained"]["embedding_key"] == "tok_emb.weight"
    res = runner.invoke(
        app,
        [
            "check-tokenizer",
            str(tmp_path / "tok.json"),
            "--checkpoint",
            str(tmp_path),
            "--embedding-key",
            "nope",
        ],
    )
    assert res.exit_code == 2 and "tok_emb.weight" in res.output
