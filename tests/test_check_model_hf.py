"""`check-model --hf`: real Hugging Face architectures built from their configs (random
weights, no download). GPT-2 and Llama are causal; BERT's LM head with `is_decoder=false` (a
real config mistake transformers only logs a warning about) attends to the future."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainguard.checks.hf_model import load_hf_model, load_target
from trainguard.checks.model_checks import run_model_checks
from trainguard.checks.model_target import ModelTargetError
from trainguard.cli import app

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
runner = CliRunner()
VOCAB = 64
TINY = {
    "gpt2": transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
        eos_token_id=0,
    ),
    "llama": transformers.LlamaConfig(
        num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=64,
    ),
    "bert_not_decoder": transformers.BertConfig(
        num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        vocab_size=VOCAB, max_position_embeddings=64, is_decoder=False,
    ),
}  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def saved(tmp_path: Path, name: str) -> Path:
    """The model folder save_pretrained would hold (its config.json; weights are not read)."""
    folder = tmp_path / name
    TINY[name].save_pretrained(folder)
    return folder


def invoke(*args):
    result = runner.invoke(app, ["check-model", *map(str, args)])
    return result.exit_code, result.output


def errors(findings) -> set[str]:
    return {f.code for f in findings if f.severity == "error"}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_causal_hf_architectures_pass(tmp_path: Path, name: str) -> None:
    model = load_hf_model(str(saved(tmp_path, name)))
    assert type(model).__name__ == {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[name]
    report = run_model_checks(model, VOCAB, 12, batch_size=3, seed=0)
    assert not errors(report.findings), [str(f) for f in report.findings]


def test_bert_without_is_decoder_leaks_the_future(tmp_path: Path) -> None:
    config_json = saved(tmp_path, "bert_not_decoder") / "config.json"
    code, out = invoke("--hf", config_json, "--seq-len", 12, "--batch-size", 3, "--json")
    assert code == 1, out
    doc = json.loads(out[out.index("{") :])
    assert {"M101", "M102"} <= {f["code"] for f in doc["findings"] if f["severity"] == "error"}
    assert doc["target"] == f"hf:{config_json}"
    # The same architecture configured as a decoder is causal: the check sees the config.
    fixed = json.loads(config_json.read_text()) | {"is_decoder": True}
    config_json.write_text(json.dumps(fixed))
    code, out = invoke("--hf", config_json.parent, "--seq-len", 12, "--batch-size", 3)
    assert code == 0, out


def test_the_same_seed_builds_the_same_weights(tmp_path: Path) -> None:
    import torch

    folder = saved(tmp_path, "llama")
    a, b = load_hf_model(str(folder), seed=1), load_hf_model(str(folder), seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize(
    "setup,message",
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: p, "has no config.json"),
        (lambda p: (p / "c.json").write_text("{oops") and p / "c.json", "not valid JSON"),
        (lambda p: (p / "c.json").write_text('{"hidden_size": 8}') and p / "c.json", "model_type"),
        (
            lambda p: (p / "c.json").write_text('{"model_type": "no-such-arch"}') and p / "c.json",
            "cannot build a causal LM",
        ),
        (
            lambda p: (p / "c.json").write_text('{"model_type": "vit"}') and p / "c.json",
            "cannot build a causal LM",
        ),
        (
            lambda p: (p / "c.json").write_text(
                '{"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "x.Y"}}'
            )
            and p / "c.json",
            "remote code",
        ),
    ],
    ids=["missing", "folder-without-config", "bad-json", "no-model-type", "unknown-type",
         "not-causal-lm", "remote-code"],
)  # fmt: skip
def test_bad_hf_configs_exit_2(tmp_path: Path, setup, message: str) -> None:
    path = setup(tmp_path)
    with pytest.raises(ModelTargetError, match=message):
        load_hf_model(str(path))
    code, out = invoke("--hf", path)
    assert code == 2, out
    assert message in " ".join(out.split())


def test_target_and_hf_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(ModelTargetError, match="either TARGET"):
        load_target(None, None)
    code, out = invoke("model_zoo:make", "--hf", saved(tmp_path, "gpt2"))
    assert code == 2 and "either TARGET" in out
