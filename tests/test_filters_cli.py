"""`trainguard data filter`: kept and rejected documents in the input's format, all fields kept."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from test_filters import CLEAN, CLEAN_WITH_TABLE, PLANTED
from trainguard.cli import app

runner = CliRunner()

DOCS = [
    {"id": "clean-1", "text": CLEAN, "lang": "en", "score": 0.9},
    {"id": "short", "text": PLANTED["D210"], "lang": "en", "score": 0.1},
    {"id": "clean-2", "text": CLEAN_WITH_TABLE, "lang": "en", "score": 0.8},
    {"id": "dangling", "text": PLANTED["D240"], "lang": "de", "score": 0.5},
    {"id": "spam", "text": PLANTED["D213"], "lang": "en", "score": 0.2},
]


def run(*args: str):
    return runner.invoke(app, ["data", "filter", *args])


def test_jsonl_kept_rejected_and_json_output(tmp_path):
    src = tmp_path / "in.jsonl"
    # A document with an invalid UTF-8 byte: read with surrogateescape, rejected as D230 and
    # written back byte for byte.
    lines = [json.dumps(d, ensure_ascii=False).encode() for d in DOCS]
    lines.append(b'{"id": "latin1", "text": "' + CLEAN.replace("\n", " ").encode() + b' caf\xe9"}')
    src.write_bytes(b"\n".join(lines) + b"\n")
    res = run(str(src), "--out", str(tmp_path / "out.jsonl"), "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["ok"] is True
    assert (payload["total"], payload["kept"], payload["rejected"]) == (6, 2, 4)
    assert payload["by_code"] == {"D210": 1, "D213": 1, "D230": 1, "D240": 1}
    assert sorted(f["code"] for f in payload["findings"]) == ["D210", "D213", "D230", "D240"]
    kept = (tmp_path / "out.jsonl").read_bytes().splitlines()
    assert [json.loads(x) for x in kept] == [DOCS[0], DOCS[2]]  # every field kept
    rejected_raw = (tmp_path / "out.rejected.jsonl").read_bytes().splitlines()
    assert b"caf\xe9" in rejected_raw[-1]  # the original byte, not U+FFFD
    rejected = [json.loads(x.decode("utf-8", "surrogateescape")) for x in rejected_raw]
    assert [r["id"] for r in rejected] == ["short", "dangling", "spam", "latin1"]
    assert [r["_reject_codes"] for r in rejected] == [["D210"], ["D240"], ["D213"], ["D230"]]
    assert rejected[1]["lang"] == "de" and rejected[1]["score"] == 0.5
    assert rejected[1]["_reject_reasons"][0].startswith("D240: mentions Table 3")


def test_parquet_keeps_schema(tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(DOCS), src)
    res = run(str(src), "--out", str(tmp_path / "out"), "--json")
    assert res.exit_code == 0, res.output
    kept = pq.read_table(tmp_path / "out" / "kept.parquet")
    rejected = pq.read_table(tmp_path / "out" / "rejected.parquet")
    assert kept.schema == pq.read_schema(src)
    assert kept.to_pylist() == [DOCS[0], DOCS[2]]
    assert rejected.column_names == [
        "id",
        "text",
        "lang",
        "score",
        "_reject_codes",
        "_reject_reasons",
    ]
    assert rejected.column("_reject_codes").to_pylist() == [["D210"], ["D240"], ["D213"]]


def test_all_rejected_still_writes_valid_parquet(tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(DOCS[1:2]), src)
    res = run(str(src), "--out", str(tmp_path / "o.parquet"), "--json")
    assert res.exit_code == 0, res.output
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 0
    assert pq.read_table(tmp_path / "o.rejected.parquet").num_rows == 1


def test_disable_and_min_words(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    res = run(
        str(src),
        "--out",
        str(tmp_path / "o.jsonl"),
        "--json",
        "--disable",
        "D240",
        "--disable",
        "symbol_ratio",
        "--min-words",
        "3",
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert (payload["kept"], payload["rejected"]) == (5, 0)


def test_bad_inputs_exit_2(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"body": "no text field here"}) + "\n")
    res = run(str(src), "--out", str(tmp_path / "o.jsonl"))
    assert res.exit_code == 2
    assert "--text-field" in res.output
    res = run(str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o.jsonl"))
    assert res.exit_code == 2
    src.write_text(json.dumps({"text": CLEAN}) + "\n")
    res = run(str(src), "--out", str(tmp_path / "o.jsonl"), "--disable", "D999")
    assert res.exit_code == 2 and "D999" in res.output
    res = run(str(src), "--out", str(src))
    assert res.exit_code == 2 and "overwrite" in res.output
    src.write_text("{not json\n")
    res = run(str(src), "--out", str(tmp_path / "bad.jsonl"))
    assert res.exit_code == 2 and "not valid JSON" in res.output
    assert not (tmp_path / "bad.jsonl").exists()  # no half-written output left behind
    assert not list(tmp_path.glob(".bad*"))


def test_folder_source_and_escaped_lone_surrogate(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text(CLEAN)
    (folder / "b.txt").write_text(PLANTED["D232"])
    res = run(str(folder), "--out", str(tmp_path / "out"), "--json")
    assert res.exit_code == 0, res.output
    kept = [json.loads(x) for x in (tmp_path / "out" / "kept.jsonl").read_text().splitlines()]
    assert kept == [{"id": "a.txt", "text": CLEAN}]
    # A JSON "\ud800" escape is a lone surrogate: flagged, and written back as an escape.
    src = tmp_path / "s.jsonl"
    src.write_text('{"id": "s", "text": "' + CLEAN.replace("\n", " ") + ' \\ud800"}\n')
    res = run(str(src), "--out", str(tmp_path / "s_out.jsonl"), "--json")
    assert json.loads(res.stdout)["by_code"] == {"D230": 1}
    line = (tmp_path / "s_out.rejected.jsonl").read_text()
    assert "\\ud800" in line and json.loads(line)["_reject_codes"] == ["D230"]
