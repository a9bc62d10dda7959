"""`data contamination --engine spark`: the local scan, one source part per Spark task.

The eval side is small: the driver indexes it (`contamination.eval_index`) and broadcasts it.
The training source is cut into ordered parts (`data.corpus.source_parts`: runs of files, JSONL
byte ranges, Parquet row groups) that each executor reads with the local reader, holds out the
validation split as the local engine does, and scans with the same `EvalIndex.scan`. Each task
returns one small `Scan` (the ids of at most 20 matching documents per rule and example, one
bit per eval n-gram); the driver merges them in part order, so the report (examples, rules,
document ids and their order, overlaps) is the local engine's.

Master: `--spark-master`, else `$SPARK_MASTER`, else `local[*]` (`util/spark.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from trainguard.data.corpus import (
    CorpusStats,
    iter_part,
    no_documents,
    source_bytes,
    source_parts,
    split_of,
)
from trainguard.data.parts import part_bytes
from trainguard.dedup.contamination import (
    CONTAINMENT,
    EDIT_CONTAINMENT,
    NGRAM,
    ContaminationReport,
    EvalTask,
    contamination_report,
    eval_index,
)
from trainguard.dedup.contamination_scan import EvalIndex, Scan
from trainguard.util.spark import executor_errors, get_spark


def _scan_parts(
    parts: Iterator[Any], index: Any, text_field: str, val_fraction: float
) -> Iterator[tuple[int, tuple, int]]:
    """Executor: (part index, its packed scan, its usable documents before the split)."""
    for part in parts:
        stats = CorpusStats()
        docs = (
            d
            for d in iter_part(part, text_field, stats)
            if val_fraction <= 0 or split_of(d.id, val_fraction) == "train"
        )
        yield part.index, _pack(index.value.scan(docs)), stats.docs


def _pack(scan: Scan) -> tuple:
    """A part's scan as the driver collects it: one bit per eval n-gram and only the examples
    with a containment (a part of a large corpus touches few), not arrays as long as the eval."""
    seen = np.flatnonzero(scan.edit_best)
    return (
        scan.documents,
        np.packbits(scan.found),
        scan.ngram_docs,
        scan.minhash_docs,
        scan.edit_docs,
        seen,
        scan.edit_best[seen],
    )


def _unpack(packed: tuple, index: EvalIndex) -> Scan:
    documents, found, ngram_docs, minhash_docs, edit_docs, seen, best = packed
    scan = index.empty_scan()
    scan.documents = documents
    scan.found = np.unpackbits(found, count=len(scan.found)).astype(bool)
    scan.ngram_docs, scan.minhash_docs, scan.edit_docs = ngram_docs, minhash_docs, edit_docs
    scan.edit_best[seen] = best
    return scan


def find_contamination_spark(
    tasks: Sequence[EvalTask],
    source: str,
    text_field: str = "text",
    val_fraction: float = 0.0,
    ngram: int = NGRAM,
    containment: float = CONTAINMENT,
    edit_containment: float = EDIT_CONTAINMENT,
    master: str | None = None,
    spark: Any = None,
) -> ContaminationReport:
    """Which examples of `tasks` occur in the training documents of `source`, with Spark."""
    t0 = time.perf_counter()
    total_bytes = source_bytes(source)  # a missing or unreadable source fails before Spark
    index: EvalIndex = eval_index(tasks, ngram, containment, edit_containment)
    spark = spark or get_spark(master)
    sc = spark.sparkContext
    parts = source_parts(source, part_bytes(total_bytes, sc.defaultParallelism))
    shared = sc.broadcast(index)
    try:
        with executor_errors():  # an executor's DataError (a bad record), wrapped by Py4J
            results = (
                sc.parallelize(parts, max(len(parts), 1))
                .mapPartitions(lambda it: _scan_parts(it, shared, text_field, val_fraction))
                .collect()
            )
    finally:
        shared.unpersist()
    if sum(n for _, _, n in results) == 0:
        raise no_documents(source, CorpusStats())
    total = index.empty_scan()
    for _, packed, _ in sorted(results, key=lambda r: r[0]):
        total.merge(_unpack(packed, index))
    return contamination_report(tasks, index, total, time.perf_counter() - t0)
