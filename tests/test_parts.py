"""Sources cut into parts (the Spark engines' input): read one after the other, the parts give
exactly the documents and records of reading the whole source."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainguard.data.corpus import (
    CorpusStats,
    iter_documents,
    iter_part,
    iter_part_records,
    iter_records,
    source_parts,
)


@pytest.fixture(scope="module")
def sources(tmp_path_factory, small_corpus) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("parts")
    recs = [{"text": f"doc {i} " * (i % 7), "id": None if i % 5 else i} for i in range(300)]
    lines = []
    for i, r in enumerate(recs):
        lines.append(json.dumps(r).encode())
        if i % 11 == 0:
            lines.append(b"")  # blank lines: not documents, but they count as lines
        if i % 37 == 0:
            lines.append(b'{"text": "caf\xe9 latin-1"}')  # not UTF-8: skipped and counted
    (d / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    pq.write_table(pa.Table.from_pylist(recs), d / "a.parquet", row_group_size=17)
    return {"jsonl": d / "a.jsonl", "parquet": d / "a.parquet", "folder": small_corpus}


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "folder"])
@pytest.mark.parametrize("target", [1, 700, 1 << 30])
def test_parts_read_in_order_are_the_whole_source(sources, kind, target):
    src = str(sources[kind])
    whole_stats, part_stats = CorpusStats(), CorpusStats()
    whole = list(iter_documents(src, stats=whole_stats))
    parts = source_parts(src, target)
    assert [p.index for p in parts] == list(range(len(parts)))
    assert (len(parts) > 3) == (target < 1 << 30)
    assert [d for p in parts for d in iter_part(p, "text", part_stats)] == whole
    assert part_stats == whole_stats  # ids, line numbers and skip counts alike


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "folder"])
def test_record_parts_are_the_whole_source(sources, kind):
    src = sources[kind]
    if kind == "jsonl":  # records keep invalid bytes as surrogate escapes, marked
        assert any("\udce9" in r.text and not r.unicode for r in iter_records(src))
    parts = source_parts(src, 500)
    assert len(parts) > 3
    got = [r for p in parts for r in iter_part_records(p, "text")]
    assert got == list(iter_records(src))
