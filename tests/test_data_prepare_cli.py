"""`trainguard data prepare`: the same prepare code path as `run`, and the pre-flight checks
(tokenizer audit on the real packed stream, shuffle quality of the elastic order) on its output."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trainguard.checks.shuffle_quality import order_shuffle_quality
from trainguard.checks.tokenizer_audit import check_tokenizer
from trainguard.cli import app
from trainguard.config.schema import DataConfig, TokenizerConfig
from trainguard.data.order import ElasticOrder
from trainguard.data.prepare import PreparedData, prepare_data

# under pytest-xdist the module's tests run on one worker, so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_data_prepare_cli")

runner = CliRunner()
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SEQ = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prep_corpus")
    for module in ("json", "html"):
        for path in sorted((STDLIB / module).glob("*.py")):
            (out / module).mkdir(exist_ok=True)
            shutil.copyfile(path, out / module / path.name)
    return out


def prepare(*args: str):
    return runner.invoke(app, ["data", "prepare", *args])


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("prep_out")
    res = prepare(
        str(corpus),
        "--out",
        str(out),
        "--vocab-size",
        "400",
        "--seq-len",
        str(SEQ),
        "--val-fraction",
        "0.2",
        "--no-progress",
        "--json",
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), out


def test_prepare_writes_verified_data_and_reuses_it(prepared, corpus):
    payload, out = prepared
    assert payload["ok"] is True and payload["reused"] is False
    folder = Path(payload["dir"])
    assert folder.parent == out and (folder / "tokenizer.json").is_file()
    data = PreparedData.from_dir(folder)  # manifest and checksums verify
    assert data.train.n_tokens == payload["train_tokens"] > 0
    assert payload["vocab_size"] == 400
    again = prepare(
        str(corpus),
        "--out",
        str(out),
        "--vocab-size",
        "400",
        "--seq-len",
        str(SEQ),
        "--val-fraction",
        "0.2",
        "--no-progress",
        "--json",
    )
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["reused"] is True
    # The very code path of `run`: the recipe's prepare finds the same folder.
    cfg = DataConfig(source=str(corpus), seq_len=SEQ, val_fraction=0.2, cache_dir=str(out))
    assert prepare_data(cfg, TokenizerConfig(vocab_size=400), progress=False).dir == folder


def test_preflight_checks_on_prepared_data(prepared, corpus):
    data = PreparedData.from_dir(prepared[0]["dir"])
    texts = [p.read_text() for p in sorted(corpus.rglob("*.py"))]
    n = data.train.num_samples(SEQ)
    packed = data.train.samples(ElasticOrder(n, 0).sample_ids(0, n), SEQ)  # one epoch
    counts = np.bincount(data.train.tokens(0, data.train.n_tokens), minlength=data.vocab_size)
    findings = check_tokenizer(data.tokenizer, texts, packed_sample=packed, token_counts=counts)
    assert {f.code for f in findings} <= {"T103"}  # unseen merges are real; nothing else
    good, stats = order_shuffle_quality(data.train, ElasticOrder(n, 1337), SEQ)
    assert good == [] and stats["sources"] > 5

    class Sequential:  # a naive loader: samples in file order
        def sample_ids(self, start: int, count: int) -> np.ndarray:
            return np.arange(start, start + count)

    bad, _ = order_shuffle_quality(data.train, Sequential(), SEQ)
    assert [f.code for f in bad] == ["D301"]


def test_data_preflight_in_one_call(prepared):
    from trainguard.checks.data_preflight import data_preflight, token_counts

    data = PreparedData.from_dir(prepared[0]["dir"])
    counts = token_counts(data.train, data.vocab_size)
    assert counts.sum() == data.train.n_tokens
    findings, stats = data_preflight(data, SEQ, seed=1337)
    assert {f.code for f in findings} <= {"T103"}
    assert stats["tokenizer"]["round_trip_failures"] == 0
    assert stats["shuffle"]["mean_chi2_ratio"] < 1.5


def test_check_tokenizer_on_prepared_folder(prepared):
    folder = prepared[0]["dir"]
    res = runner.invoke(
        app,
        ["check-tokenizer", f"{folder}/tokenizer.json", "--prepared", folder, "--json"],
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["stats"]["counted_tokens"] == prepared[0]["train_tokens"]
    assert {f["code"] for f in payload["findings"]} <= {"T103"}


def test_check_tokenizer_never_advises_deleting_a_folder(prepared, tmp_path):
    """A folder the user points at may be their own: trainguard did not create it, so it never
    advises deleting it, and a damaged prepared folder is moved aside, not deleted."""
    folder = Path(prepared[0]["dir"])
    tok = f"{folder}/tokenizer.json"
    own = tmp_path / "my-experiments"
    own.mkdir()
    (own / "notes.txt").write_text("mine\n")
    res = runner.invoke(app, ["check-tokenizer", tok, "--prepared", str(own)])
    assert res.exit_code == 2 and "not a prepared data folder" in res.output, res.output
    assert "delete" not in res.output.lower() and (own / "notes.txt").exists()
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    shard = next(damaged.glob("train-*.bin"))
    data = bytearray(shard.read_bytes())
    data[7] ^= 0xFF
    shard.write_bytes(bytes(data))
    res = runner.invoke(app, ["check-tokenizer", tok, "--prepared", str(damaged)])
    output = " ".join(res.output.split())
    assert res.exit_code == 2 and "checksum mismatch" in output, output
    assert "move" in output and "aside" in output and "delete" not in output.lower()


def test_jsonl_and_parquet_sources(tmp_path, corpus):
    texts = [p.read_text() for p in sorted(corpus.rglob("*.py"))]
    rows = [{"id": f"d{i}", "text": t, "lang": "py"} for i, t in enumerate(texts * 3)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    for name in ("c.jsonl", "c.parquet"):
        res = prepare(
            str(tmp_path / name),
            "--out",
            str(tmp_path / "out"),
            "--vocab-size",
            "300",
            "--seq-len",
            "8",
            "--val-fraction",
            "0.3",
            "--no-progress",
            "--json",
        )
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["stats"]["docs"] == len(rows)


def test_bad_options_exit_2(tmp_path, corpus):
    res = prepare(str(tmp_path / "missing"), "--out", str(tmp_path / "o"), "--no-progress")
    assert res.exit_code == 2
    res = prepare(str(corpus), "--out", str(tmp_path / "o"), "--seq-len", "4", "--no-progress")
    assert res.exit_code == 2 and "seq_len" in res.output
