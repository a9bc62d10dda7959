"""The Spark engine: the local engine's algorithm, distributed with PySpark.

Executors do the per-document work (parse, normalise, exact key, MinHash, band keys, bucket
verification, shingle sets for the exact checks) with the same functions and seeds as the local
engine; the driver holds only the duplicate links (exact pairs, verified edges and the pairs near
the threshold, one small tuple each) and the shingle sets of the documents in those pairs, and
runs the shared exact check, union-find and `plan.resolve`, so both engines keep the same
documents. Kept records are written by the executors as a folder of part files in the input's
format; the clusters file is written by the driver. Input is one JSONL or Parquet file (its
order defines "first").

Master: `--spark-master`, else `$SPARK_MASTER`, else `local[*]` (`util/spark.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.data.corpus import fields_record, jsonl_record
from trainguard.dedup import io
from trainguard.dedup.lsh import DedupParams, UnionFind, band_keys, bucket_links, exact_edges
from trainguard.dedup.minhash import MinHasher, shingle_set
from trainguard.dedup.normalise import exact_key, normalise
from trainguard.dedup.plan import resolve, with_ids
from trainguard.dedup.report import DedupReport, TextStats, check_params, default_clusters_path
from trainguard.errors import DataError
from trainguard.util.atomic import atomic_paths, check_writable
from trainguard.util.inputs import open_parquet
from trainguard.util.paths import is_url
from trainguard.util.spark import executor_errors, get_spark

_NORMAL, _EMPTY, _SHORT = 0, 1, 2
_BATCH = 1024


def _docs_partition(rows: Iterator[tuple[int, str, Any]], p: DedupParams) -> Iterator[tuple]:
    """(idx, text, id) -> (idx, exact key, signature, flag, id), hashed in batches."""
    hasher = MinHasher(p.num_perm, p.seed, p.ngram)
    while chunk := list(islice(rows, _BATCH)):
        norms = [normalise(text) for _, text, _ in chunk]
        sigs = hasher.signatures(norms)
        for (idx, _, doc_id), norm, sig in zip(chunk, norms, sigs, strict=True):
            stats = TextStats()
            stats.add(norm, p.ngram)
            flag = _EMPTY if stats.empty else _SHORT if stats.short else _NORMAL
            yield idx, exact_key(norm), sig, flag, doc_id


def _band_partition(rows: Iterator[tuple[int, np.ndarray]], p: DedupParams) -> Iterator[tuple]:
    """(idx, sig) -> ((band, key), (idx, sig)) for every band."""
    while chunk := list(islice(rows, _BATCH)):
        keys = band_keys(np.stack([sig for _, sig in chunk]), p.bands, p.rows)
        for (idx, sig), k in zip(chunk, keys.tolist(), strict=True):
            for b, key in enumerate(k):
                yield (b, key), (idx, sig)


def _bucket(members: Any, p: DedupParams) -> list[tuple[bool, int, int]]:
    """(sure, later, earlier) links of one bucket: sure edges, or pairs for the exact check."""
    items = sorted(members, key=lambda m: m[0])
    if len(items) < 2:
        return []
    idx = np.array([i for i, _ in items], dtype=np.int64)
    edges, unsure = bucket_links(idx, np.stack([s for _, s in items]), p)
    return [(True, a, b) for a, b in edges] + [(False, a, b) for a, b in unsure]


def _read(spark: Any, path: str, fmt: str, text_field: str, id_field: str) -> tuple[Any, Any]:
    """(indexed payload RDD of (idx, line-or-Row), RDD of (idx, text, id)), input order."""
    if fmt == "jsonl":
        lines = spark.sparkContext.textFile(path)
        # bytes.strip() in the local engine strips exactly these (ASCII whitespace).
        indexed = (
            lines.filter(lambda s: s.strip(" \t\n\r\f\v"))
            .zipWithIndex()
            .map(lambda t: (t[1], t[0]))
        )

        def texts(t: tuple[int, str]) -> tuple[int, str, Any]:
            where = f"{path}, document {t[0]}"
            rec = jsonl_record(t[1], where, (where, where), text_field, id_field)
            return t[0], rec.text, rec.fields.get(id_field)

        return indexed, indexed.map(texts)
    df = spark.read.parquet(path)
    if text_field not in df.columns:
        raise DataError(
            f"{path} has no column {text_field!r} (columns: {', '.join(df.columns)})",
            "pass --text-field with the name of the text column",
        )
    indexed = df.rdd.zipWithIndex().map(lambda t: (t[1], t[0]))

    def texts_pq(t: tuple[int, Any]) -> tuple[int, str, Any]:
        where = f"{path}, document {t[0]}"
        rec = fields_record(t[1].asDict(), where, (where, where), text_field, id_field)
        return t[0], rec.text, rec.fields.get(id_field)

    return indexed, indexed.map(texts_pq)


def dedup_file_spark(
    in_path: str | Path,
    out_path: str | Path,
    clusters_path: str | Path | None = None,
    params: DedupParams | None = None,
    text_field: str = "text",
    id_field: str = "id",
    spark: Any = None,
    master: str | None = None,
) -> DedupReport:
    """Deduplicate IN into the folder OUT (part files, input format) with Spark."""
    params = params or DedupParams()
    check_params(params)
    in_str = str(in_path)
    fmt = io.spark_input_format(in_path)
    if fmt == "parquet" and Path(in_str).is_file():
        open_parquet(in_str, "input", DataError)  # not Parquet: a clear error, not a Java one
    clusters_path = clusters_path or default_clusters_path(Path(out_path))
    io.check_output(out_path, fmt, in_path, clusters_path, folder_ok=True)
    if not is_url(out_path):
        check_writable(out_path, folder=True)  # before Spark starts, not after the work
    spark = spark or get_spark(master)
    sc = spark.sparkContext
    t0 = time.perf_counter()
    indexed, texts = _read(spark, in_str, fmt, text_field, id_field)
    p = params
    docs = texts.mapPartitions(lambda it: _docs_partition(it, p)).persist()
    with executor_errors():  # an executor's DataError, wrapped by Py4J
        flags = docs.map(lambda d: d[3]).countByValue()
    n = int(sum(flags.values()))
    stats = TextStats(empty=int(flags.get(_EMPTY, 0)), short=int(flags.get(_SHORT, 0)))

    # Exact duplicates: every document points at the smallest index with its key.
    by_key = docs.map(lambda d: (d[1], d[0]))
    reps = by_key.reduceByKey(min)
    exact_rep = dict(by_key.join(reps).values().filter(lambda t: t[0] != t[1]).collect())
    copies = sc.broadcast(set(exact_rep))

    # Near duplicates among first-of-their-text, non-empty documents.
    uniq = docs.filter(lambda d: d[3] != _EMPTY and d[0] not in copies.value).map(
        lambda d: (d[0], d[2])
    )
    links = (
        uniq.mapPartitions(lambda it: _band_partition(it, p))
        .groupByKey()
        .flatMap(lambda kv: _bucket(kv[1], p))
        .collect()
    )
    edges = [(a, b) for sure, a, b in links if sure]
    unsure = [(a, b) for sure, a, b in links if not sure]
    if unsure:
        need = sc.broadcast({i for pair in unsure for i in pair})
        ngram = p.ngram
        shingles = dict(
            texts.filter(lambda t: t[0] in need.value)
            .map(lambda t: (t[0], shingle_set(normalise(t[1]), ngram)))
            .collect()
        )
        edges += exact_edges(unsure, shingles, p.threshold)
        need.unpersist()
    near_root = UnionFind().roots(edges)
    involved = sc.broadcast(set(near_root) | set(near_root.values()))
    sigs = dict(uniq.filter(lambda t: t[0] in involved.value).collect())

    def similarity(a: int, b: int) -> float:
        return float(np.count_nonzero(sigs[a] == sigs[b])) / p.num_perm

    rows = resolve(exact_rep, near_root, similarity)
    named = sc.broadcast({r.removed for r in rows} | {r.kept for r in rows})
    ids = dict(docs.filter(lambda d: d[0] in named.value).map(lambda d: (d[0], d[4])).collect())
    rows = with_ids(rows, ids.get)
    removed = sc.broadcast({r.removed for r in rows})
    kept = indexed.filter(lambda t: t[0] not in removed.value).values()
    out = str(out_path)
    if fmt == "jsonl":
        spark.createDataFrame(kept.map(lambda line: (line,)), "value string").write.mode(
            "overwrite"
        ).text(out)
    else:
        schema = spark.read.parquet(in_str).schema
        spark.createDataFrame(kept, schema).write.mode("overwrite").parquet(out)
    if is_url(clusters_path):
        io.write_jsonl(clusters_path, [r.to_dict() for r in rows])
    else:
        with atomic_paths(clusters_path) as (tmp,):
            io.write_jsonl(tmp, [r.to_dict() for r in rows])
    docs.unpersist()
    for b in (copies, involved, named, removed):
        b.unpersist()
    seconds = time.perf_counter() - t0
    return DedupReport.build("spark", params, n, rows, stats, seconds, out, clusters_path, fmt)
