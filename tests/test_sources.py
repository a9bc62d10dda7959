"""One source reader (`data/corpus.py`): every command that reads documents accepts the same
sources, refuses the same bad ones with the same message, and treats text that is not valid
Unicode the same way (set aside and counted for training, D230 for the filters, compared like
any other by dedup: never fatal, never lost).

The same twelve documents are written as a folder of text files, a .jsonl, a .NDJSON, a .parquet
and a .pq file, with the same ids; each command must see the same documents in each (prepare
even produces the same token counts). Commands run in process (CliRunner).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trainguard.cli import app
from trainguard.data.corpus import iter_documents, iter_records

runner = CliRunner()

WORDS = [
    *("river", "town", "baker", "harbour", "lighthouse", "station", "map", "morning"),
    *("stranger", "kitchen", "school", "football", "orchard", "market", "valley"),
    *("mountain", "window", "garden", "letter", "winter", "summer"),
]
DOCS = {
    f"doc{i:02d}.txt": " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(60 + 5 * i))
    + f" (document {i})."
    for i in range(12)
}
SOURCES = ("folder", "jsonl", "ndjson", "parquet", "pq")
SMALL = ("--vocab-size", "260", "--seq-len", "8", "--val-fraction", "0.25", "--no-progress")


def _jsonl(path: Path, docs: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in docs.items()))
    return path


def _parquet(path: Path, docs: dict[str, str]) -> Path:
    pq.write_table(pa.table({"id": list(docs), "text": list(docs.values())}), path)
    return path


def make_source(kind: str, root: Path, docs: dict[str, str] = DOCS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if kind == "folder":
        folder = root / "texts"
        folder.mkdir()
        for name, text in docs.items():
            (folder / name).write_text(text)
        (folder / ".hidden.txt").write_text("tooling, not corpus")
        (folder / ".git").mkdir()
        (folder / ".git" / "HEAD").write_text("ref: refs/heads/main")
        return folder
    if kind in ("jsonl", "ndjson"):
        return _jsonl(root / f"docs.{kind.upper() if kind == 'ndjson' else kind}", docs)
    return _parquet(root / f"docs.{kind}", docs)


def invoke(*args: str):
    return runner.invoke(app, [*map(str, args)])


def payload(result) -> dict:
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout[result.stdout.index("{") :])


def tokenizer_file(path: Path) -> Path:
    from trainguard.data.tokenizer import train_tokenizer

    path.write_text(train_tokenizer(iter(DOCS.values()), 300, 2).to_str())
    return path


def what_each_command_sees(source: Path, work: Path) -> dict[str, object]:
    prepared = payload(invoke("data", "prepare", source, "--out", work / "p", *SMALL, "--json"))
    filtered = payload(invoke("data", "filter", source, "--out", work / "f", "--json"))
    inspected = payload(invoke("data", "inspect", source, "--n", "3", "--json"))
    out = work / f"d{_out_suffix(source)}"
    deduped = payload(invoke("data", "dedup", source, "--out", out, "--json"))
    tok = tokenizer_file(work / "tok.json")
    audited = payload(invoke("check-tokenizer", tok, "--corpus", source, "--json"))
    return {
        "prepare": (prepared["stats"]["docs"], prepared["stats"]["bytes"]),
        "prepare_tokens": (prepared["train_tokens"], prepared["val_tokens"]),
        "filter": (filtered["total"], filtered["kept"]),
        "inspect": inspected["total"],
        "dedup": (deduped["counts"]["input"], deduped["counts"]["kept"]),
        "check-tokenizer": audited["stats"]["round_trip_docs"],
    }


def test_every_command_reads_every_kind_of_source_alike(tmp_path):
    seen = {
        kind: what_each_command_sees(make_source(kind, tmp_path / kind), tmp_path / kind)
        for kind in SOURCES
    }
    reference = seen["folder"]
    assert reference["prepare"][0] == reference["inspect"] == reference["dedup"][0] == len(DOCS)
    assert reference["check-tokenizer"] == len(DOCS)
    for kind in SOURCES:
        assert seen[kind] == reference, kind


def test_the_reader_yields_the_same_records_for_every_kind(tmp_path):
    records = {
        kind: [(r.id, r.text, r.unicode) for r in iter_records(make_source(kind, tmp_path / kind))]
        for kind in SOURCES
    }
    assert records["folder"] == [(k, v, True) for k, v in DOCS.items()]
    assert all(records[kind] == records["folder"] for kind in SOURCES)


BAD = {
    "missing": (lambda root: root / "nothing.jsonl", "does not exist"),
    "csv": (lambda root: _write(root / "docs.csv", b"id,text\n1,hello\n"), "neither JSON Lines"),
    "url": (lambda root: "s3://bucket/docs.jsonl", "URL"),
    "fake-parquet": (
        lambda root: _write(root / "docs.parquet", b"PAR1 not really"),
        "not a readable Parquet file",
    ),
    "not-json": (lambda root: _write(root / "docs.jsonl", b'{"text": "a"}\nnot json\n'), ":2"),
    "no-text": (lambda root: _write(root / "docs.ndjson", b'{"body": "a"}\n'), "'text'"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _out_suffix(source: str | Path) -> str:
    """Dedup keeps the input's format: its OUT is named like the input."""
    return ".parquet" if str(source).endswith((".parquet", ".pq")) else ".jsonl"


def _commands(source: str, work: Path, tok: Path) -> dict[str, tuple[str, ...]]:
    return {
        "run": ("run", "default", "--run-dir", work / "r", "--set", f"data.source={source}"),
        "prepare": ("data", "prepare", source, "--out", work / "p", *SMALL),
        "filter": ("data", "filter", source, "--out", work / "f"),
        "inspect": ("data", "inspect", source),
        "dedup": ("data", "dedup", source, "--out", work / f"d{_out_suffix(source)}"),
        "check-tokenizer": ("check-tokenizer", tok, "--corpus", source),
    }


@pytest.mark.parametrize("bad", sorted(BAD))
def test_every_command_refuses_the_same_bad_sources(tmp_path, bad):
    make, says = BAD[bad]
    source = str(make(tmp_path))
    tok = tokenizer_file(tmp_path / "tok.json")
    for name, args in _commands(source, tmp_path / "work", tok).items():
        result = invoke(*args)
        assert result.exit_code == 2, (name, result.output)
        assert says in result.output, (name, result.output)
        assert "Traceback" not in result.output


def test_text_that_is_not_unicode_is_never_fatal_nor_lost(tmp_path):
    """A line with a Latin-1 byte and a line with a JSON `\\ud800` escape among good ones."""
    good = [json.dumps({"id": k, "text": v}).encode() + b"\n" for k, v in DOCS.items()]
    latin1 = b'{"id": "latin1", "text": "caf\xe9 ' + b"word " * 30 + b'"}\n'
    surrogate = b'{"id": "surrogate", "text": "lone \\ud800 ' + b"word " * 30 + b'"}\n'
    source = _write(tmp_path / "mixed.jsonl", b"".join([*good[:6], latin1, surrogate, *good[6:]]))
    records = list(iter_records(source))
    assert [r.id for r in records if not r.unicode] == ["latin1", "surrogate"]
    assert len(list(iter_documents(str(source)))) == len(DOCS)

    prepared = payload(invoke("data", "prepare", source, "--out", tmp_path / "p", *SMALL, "--json"))
    assert prepared["stats"]["skipped_non_utf8"] == 2 and prepared["stats"]["docs"] == len(DOCS)
    assert [f["code"] for f in prepared["findings"]] == ["D101"]

    filtered = payload(invoke("data", "filter", source, "--out", tmp_path / "f", "--json"))
    assert filtered["by_code"].get("D230") == 2 and filtered["total"] == len(DOCS) + 2
    rejected = (tmp_path / "f" / "rejected.jsonl").read_bytes()
    assert b"caf\xe9" in rejected and b"\\ud800" in rejected  # byte for byte, escape kept

    inspected = payload(invoke("data", "inspect", source, "--json"))
    assert inspected["by_code"].get("D230") == 2

    deduped = payload(invoke("data", "dedup", source, "--out", tmp_path / "d.jsonl", "--json"))
    assert deduped["counts"]["input"] == len(DOCS) + 2
    assert (tmp_path / "d.jsonl").read_bytes() == source.read_bytes()  # nothing was a duplicate

    tok = tokenizer_file(tmp_path / "tok.json")
    audited = payload(invoke("check-tokenizer", tok, "--corpus", source, "--json"))
    assert audited["stats"]["round_trip_docs"] == len(DOCS)

    # Contamination reads the training documents as training does: both set aside, not fatal.
    words = DOCS["doc03.txt"].split()
    example = {"prompt": " ".join(words[:10]), "answer": " " + " ".join(words[10:20])}
    _write(tmp_path / "ex.jsonl", json.dumps(example).encode() + b"\n")
    spec = b"name: s\ntasks:\n- {name: t, type: generation, data: ex.jsonl}\n"
    spec_path = _write(tmp_path / "spec.yaml", spec)
    found = payload(invoke("data", "contamination", source, "--evals", spec_path, "--json"))
    assert [f["data"]["training_documents"] for f in found["findings"]] == [len(DOCS)]
    assert "doc03.txt" in found["tasks"][0]["contaminated"][0]["train_ids"]


def test_dedup_reads_a_folder_and_writes_its_records_as_jsonl(tmp_path):
    docs = {**DOCS, "copy.txt": DOCS["doc03.txt"]}
    folder = make_source("folder", tmp_path, docs)
    deduped = payload(invoke("data", "dedup", folder, "--out", tmp_path / "d.jsonl", "--json"))
    assert deduped["counts"]["input"] == len(docs) and deduped["counts"]["exact_duplicates"] == 1
    kept = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    # Files are read in sorted order: copy.txt comes first, so doc03.txt is the duplicate.
    assert [r["id"] for r in kept] == [k for k in sorted(docs) if k != "doc03.txt"]
    assert all(r["text"] == docs[r["id"]] for r in kept)
