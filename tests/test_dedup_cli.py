"""`trainguard data dedup`: JSON output, formats, exit statuses."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from trainguard.cli import app
from trainguard.dedup import io
from trainguard.dedup.planted import planted_corpus

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["data", "dedup", *args])


def test_json_output_and_jsonl_round_trip(tmp_path):
    p = planted_corpus(
        n_background=60, similarities=(0.95, 0.3), copies_each=2, exact=2, normalised=2, seed=11
    )
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in p.records))
    res = run(str(src), "--out", str(tmp_path / "out.jsonl"), "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert set(payload) >= {
        "ok",
        "findings",
        "counts",
        "seconds",
        "docs_per_s",
        "engine",
        "bands",
        "rows",
        "threshold",
    }
    assert payload["ok"] is True
    assert payload["counts"] == {
        "input": len(p.records),
        "kept": len(p.records) - 6,
        "exact_duplicates": 4,
        "near_duplicates": 2,
    }
    assert (payload["engine"], payload["bands"], payload["rows"], payload["threshold"]) == (
        "local",
        14,
        8,
        0.8,
    )
    assert [f["code"] for f in payload["findings"]] == ["D201"]
    kept = io.read_records(tmp_path / "out.jsonl")
    assert len(kept) == payload["counts"]["kept"]
    removed = p.must_remove(0.9)
    assert kept == [r for i, r in enumerate(p.records) if i not in removed]
    clusters = io.read_records(tmp_path / "out.clusters.jsonl")
    assert sorted(c["removed"] for c in clusters) == sorted(removed)


def test_parquet_round_trip_with_custom_field_and_clusters_path(tmp_path):
    recs = [{"body": f"document number {i} " * 3, "n": i} for i in range(10)]
    recs.append({"body": recs[4]["body"].upper(), "n": 10})
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "in.parquet")
    res = run(
        str(tmp_path / "in.parquet"),
        "--out",
        str(tmp_path / "o.parquet"),
        "--text-field",
        "body",
        "--clusters",
        str(tmp_path / "cl.jsonl"),
        "--threshold",
        "0.9",
        "--json",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["threshold"] == 0.9
    assert pq.read_table(tmp_path / "o.parquet").to_pylist() == recs[:10]
    assert io.read_records(tmp_path / "cl.jsonl") == [
        {
            "removed": 10,
            "kept": 4,
            "kind": "exact",
            "similarity": 1.0,
            "removed_id": None,
            "kept_id": None,
        }
    ]


def test_bad_input_exits_2_with_a_clear_message(tmp_path):
    good = tmp_path / "in.jsonl"
    good.write_text('{"text": "a b c d e f"}\n')
    (tmp_path / "in.txt").write_text("hello\n")
    cases = [
        ((str(tmp_path / "missing.jsonl"),), "does not exist"),
        ((str(tmp_path / "in.txt"),), "neither JSON Lines nor Parquet"),
        ((str(good), "--threshold", "1.5"), "out of range"),
        ((str(good), "--threshold", "0"), "out of range"),
    ]
    for args, message in cases:
        res = run(*args, "--out", str(tmp_path / "o.jsonl"))
        assert res.exit_code == 2, (args, res.output)
        assert message in res.output
        assert "fix:" in res.output
    res = run(str(good), "--out", str(tmp_path / "o.jsonl"), "--engine", "dask")
    assert res.exit_code == 2
