"""The Spark engines of `data prepare` and `data filter` (real PySpark, local mode) give the
local engines' results: the same prepared bytes, the same kept and rejected records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("pyspark")

from trainguard.cli import app  # noqa: E402

# one Spark session (the JVM starts once per worker): every Spark test on the same worker
pytestmark = pytest.mark.xdist_group("spark")

runner = CliRunner()


def prepared_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def prepare(source: Path, out: Path, *extra: str) -> dict:
    res = runner.invoke(
        app,
        [
            "data",
            "prepare",
            str(source),
            "--out",
            str(out),
            "--vocab-size",
            "400",
            "--val-fraction",
            "0.2",
            "--shard-tokens",
            "4096",
            "--seq-len",
            "16",
            "--no-progress",
            "--json",
            *extra,
        ],
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_prepare_spark_writes_the_local_engines_bytes(tmp_path, small_corpus, spark):
    source = tmp_path / "src"  # three packages of the session corpus: several parts, quick
    for name in ("json", "html", "urllib"):
        shutil.copytree(small_corpus / name, source / name)
    local = prepare(source, tmp_path / "local")
    sp = prepare(source, tmp_path / "spark", "--engine", "spark")
    assert sp["reused"] is False
    a, b = prepared_files(Path(local["dir"])), prepared_files(Path(sp["dir"]))
    assert sorted(a) == sorted(b)
    assert len([n for n in a if n.endswith(".bin")]) > 4  # several shards per split
    for name in a:
        assert a[name] == b[name], name  # tokenizer, shards, indexes and manifest alike
    assert {k: v for k, v in sp.items() if k not in ("dir", "tokenizer_path")} == {
        k: v for k, v in local.items() if k not in ("dir", "tokenizer_path")
    }


def filter_docs() -> list[bytes]:
    """Clean and planted documents (every rule family), repeated so the source spans several
    Spark partitions, with an invalid UTF-8 byte and blank lines on the way."""
    from test_filters import CLEAN, CLEAN_WITH_TABLE, PLANTED

    texts = [CLEAN, CLEAN_WITH_TABLE, *(PLANTED[c] for c in sorted(PLANTED))]
    lines = []
    for i in range(12):
        for j, text in enumerate(texts):
            rec = {"id": f"d{i}-{j}", "text": text, "meta": {"i": i, "tags": ["x"] * (j % 3)}}
            lines.append(json.dumps(rec).encode())
        lines.append(
            b'{"id": "latin1-%d", "text": "' % i + CLEAN.replace("\n", " ").encode() + b' caf\xe9"}'
        )
        lines.append(b"")
    return lines


def run_filter(src: Path, out: Path, *extra: str) -> dict:
    res = runner.invoke(app, ["data", "filter", str(src), "--out", str(out), "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def part_bytes_of(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.glob("part-*")))


def test_filter_spark_keeps_and_rejects_what_the_local_engine_does(tmp_path, spark):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(filter_docs()) + b"\n")
    local = run_filter(src, tmp_path / "local.jsonl")
    sp = run_filter(src, tmp_path / "spark.jsonl", "--engine", "spark")
    counts = ("total", "kept", "rejected", "by_code")
    assert {k: sp[k] for k in counts} == {k: local[k] for k in counts}
    assert local["rejected"] > local["kept"] > 0 and len(local["by_code"]) >= 10
    assert len(list((tmp_path / "spark.jsonl").glob("part-*"))) > 2  # several partitions
    # The part files in order hold the local engine's lines, byte for byte.
    assert part_bytes_of(tmp_path / "spark.jsonl") == (tmp_path / "local.jsonl").read_bytes()
    assert (
        part_bytes_of(tmp_path / "spark.rejected.jsonl")
        == (tmp_path / "local.rejected.jsonl").read_bytes()
    )
    # Running again replaces the output folders; a file in the way is a write failure (exit 1)
    # found before any work, and the file is left as it was.
    again = run_filter(src, tmp_path / "spark.jsonl", "--engine", "spark")
    assert again["kept"] == local["kept"]
    res = runner.invoke(
        app,
        ["data", "filter", str(src), "--out", str(tmp_path / "local.jsonl"), "--engine", "spark"],
    )
    assert res.exit_code == 1 and "cannot write" in res.output, res.output
    assert (tmp_path / "local.jsonl").is_file()


@pytest.mark.slow  # a second Spark pass; the JSONL test is the default representative
def test_filter_spark_parquet_rows_match_local(tmp_path, spark):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from test_filters import CLEAN, PLANTED

    rows = [
        {"id": i, "text": [CLEAN, PLANTED["D210"], PLANTED["D240"]][i % 3], "score": i / 7}
        for i in range(90)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet", row_group_size=8)
    local = run_filter(tmp_path / "in.parquet", tmp_path / "local.parquet")
    sp = run_filter(tmp_path / "in.parquet", tmp_path / "sp.parquet", "--engine", "spark")
    assert (sp["kept"], sp["rejected"], sp["by_code"]) == (
        local["kept"],
        local["rejected"],
        local["by_code"],
    )
    for name in ("", ".rejected"):
        parts = sorted((tmp_path / f"sp{name}.parquet").glob("part-*"))
        spark_rows = [r for p in parts for r in pq.read_table(p).to_pylist()]
        assert spark_rows == pq.read_table(tmp_path / f"local{name}.parquet").to_pylist()


def test_spark_engines_report_a_bad_record_as_bad_input(tmp_path, spark):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "fine words here"}\n\n{"text": broken\n')
    res = runner.invoke(
        app, ["data", "filter", str(src), "--out", str(tmp_path / "o.jsonl"), "--engine", "spark"]
    )
    assert res.exit_code == 2, res.output
    assert "in.jsonl:3 is not valid JSON" in res.output
    res = runner.invoke(
        app,
        ["data", "prepare", str(src), "--out", str(tmp_path / "p"), "--engine", "spark"],
    )
    assert res.exit_code == 2, res.output
    assert "in.jsonl:3 is not valid JSON" in res.output
    assert not any((tmp_path / "p").glob("*/manifest.json"))  # nothing half-prepared left
