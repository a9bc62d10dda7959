"""The Spark engine (real PySpark, local mode) keeps exactly what the local engine keeps.

The Spark session is the session-scoped `spark` fixture of conftest.py, shared with the
prepare and filter Spark tests (one JVM per test process)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pyspark = pytest.importorskip("pyspark")

from typer.testing import CliRunner  # noqa: E402

from trainguard.cli import app  # noqa: E402
from trainguard.dedup import io  # noqa: E402
from trainguard.dedup.local import dedup_file  # noqa: E402
from trainguard.dedup.planted import planted_corpus  # noqa: E402
from trainguard.dedup.spark import dedup_file_spark  # noqa: E402

# one Spark session (the JVM starts once per worker): every Spark test on the same worker
pytestmark = pytest.mark.xdist_group("spark")


def corpus():
    p = planted_corpus(
        n_background=100,
        similarities=(0.95, 0.9, 0.8, 0.5, 0.3),
        copies_each=2,
        exact=3,
        normalised=3,
        seed=21,
    )
    extra = [
        {"id": "empty-1", "text": ""},
        {"id": "short", "text": "tiny text"},
        {"id": "empty-2", "text": "  \n "},
    ]
    return p, p.records[:50] + extra + p.records[50:]


def test_spark_cli_keeps_same_documents_as_local_on_jsonl(tmp_path, spark):
    p, records = corpus()
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    local = dedup_file(src, tmp_path / "local.jsonl")
    res = CliRunner().invoke(
        app,
        [
            "data",
            "dedup",
            str(src),
            "--out",
            str(tmp_path / "sp.jsonl"),
            "--engine",
            "spark",
            "--spark-master",
            "local[2]",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["engine"] == "spark"
    assert payload["counts"] == local.counts.to_dict()
    assert local.counts.exact_duplicates >= 7  # 3 exact + 3 normalised + the second empty doc
    assert io.read_records(tmp_path / "sp.jsonl") == io.read_records(tmp_path / "local.jsonl")
    assert io.read_records(tmp_path / "sp.clusters.jsonl") == io.read_records(
        tmp_path / "local.clusters.jsonl"
    )
    assert {f["code"] for f in payload["findings"]} == {f.code for f in local.findings}


@pytest.mark.slow  # a second Spark pass over the same corpus; the JSONL test is the default
def test_spark_keeps_same_rows_as_local_on_parquet(tmp_path, spark):
    _, records = corpus()
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "in.parquet", row_group_size=20)
    local = dedup_file(tmp_path / "in.parquet", tmp_path / "local.parquet")
    sp = dedup_file_spark(tmp_path / "in.parquet", tmp_path / "sp.parquet", spark=spark)
    assert sp.rows == local.rows
    assert (
        io.read_records(tmp_path / "sp.parquet")
        == pq.read_table(tmp_path / "local.parquet").to_pylist()
    )


def test_spark_bad_record_is_bad_input(tmp_path, spark):
    from trainguard.errors import DataError

    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match="document 1 has no string field 'text'") as e:
        dedup_file_spark(src, tmp_path / "o.jsonl", spark=spark)
    assert "--text-field" in e.value.fix
