"""`data filter --engine spark`: the local engine's filter, one source part per Spark task.

The source is cut into parts (`data.corpus.source_parts`: JSONL byte ranges, Parquet row groups,
runs of files) that each executor reads with the one source reader and filters with the same
rules and the same writer code (`run.filter_into`), writing `part-<n>` files: the kept and rejected
outputs are folders of part files named like the local engine's files, whose part files in
order hold exactly the local engine's records (JSONL: the same bytes). Both folders are written
under temporary names and renamed into place at the end, so a failed run leaves the previous
output as it was; a file where a folder goes fails before any work. The executors write into
the output folders, so they must be reachable by them: local mode, or a shared filesystem. A
Parquet OUT from a JSONL or folder source infers each part file's schema from its own records,
as the local engine infers it from its first batch.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from trainguard.data.corpus import iter_part_records, source_bytes, source_kind, source_parts
from trainguard.data.parts import part_bytes
from trainguard.filters.base import FilterConfig
from trainguard.filters.filtering import FilterSummary, filter_into
from trainguard.filters.records import RecordWriter, output_paths, parquet_schemas
from trainguard.filters.registry import select_rules
from trainguard.util.atomic import check_writable, make_temp_dir
from trainguard.util.spark import executor_errors, get_spark


def _filter_parts(parts: Any, job: dict[str, Any]) -> Any:
    """Executor: filter each part into its kept and rejected part files; yield its counts."""
    rules = select_rules(job["disabled"])
    fmt = job["fmt"]
    for part in parts:
        name = f"part-{part.index:05d}.{fmt}"
        by_code: Counter[str] = Counter()
        with (
            RecordWriter(Path(job["kept"]) / name, fmt, job["kept_schema"]) as kept,
            RecordWriter(Path(job["rejected"]) / name, fmt, job["rejected_schema"]) as rejected,
        ):
            records = iter_part_records(part, job["text_field"])
            total = filter_into(records, job["config"], rules, kept, rejected, by_code)
        yield total, kept.count, rejected.count, dict(by_code)


def _swap_in(tmp: Path, final: Path) -> None:
    """Rename the finished folder `tmp` onto `final`, replacing an earlier output folder."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.is_dir():
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def filter_source_spark(
    source: str | Path,
    out: str | Path,
    text_field: str = "text",
    config: FilterConfig | None = None,
    disabled: list[str] | tuple[str, ...] = (),
    master: str | None = None,
) -> FilterSummary:
    """Filter `source` with Spark into folders of part files at the local engine's paths."""
    t0 = time.perf_counter()
    select_rules(disabled)  # unknown names fail here, before Spark starts
    kept_path, rejected_path, fmt = output_paths(source, out)
    for path in (kept_path, rejected_path):
        check_writable(path, folder=True)  # a file in the way, a read-only folder: now
    kept_schema = rejected_schema = None
    if fmt == "parquet" and source_kind(source) == "parquet":
        kept_schema, rejected_schema = parquet_schemas(source)
    spark = get_spark(master)
    sc = spark.sparkContext
    parts = source_parts(source, part_bytes(source_bytes(source), sc.defaultParallelism))
    tmp = {}
    for path in (kept_path, rejected_path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp[path] = make_temp_dir(path.parent, prefix=f".{path.name}.tmp-")
    job = {
        "fmt": fmt,
        "text_field": text_field,
        "config": config,
        "disabled": list(disabled),
        "kept": str(tmp[kept_path]),
        "rejected": str(tmp[rejected_path]),
        "kept_schema": kept_schema,
        "rejected_schema": rejected_schema,
    }
    try:
        with executor_errors():
            counts = (
                sc.parallelize(parts, len(parts))
                .mapPartitions(lambda it: _filter_parts(it, job))
                .collect()
            )
        for final, folder in tmp.items():
            _swap_in(folder, final)
    finally:
        for folder in tmp.values():
            shutil.rmtree(folder, ignore_errors=True)
    by_code: Counter[str] = Counter()
    for _, _, _, codes in counts:
        by_code.update(codes)
    return FilterSummary(
        total=sum(c[0] for c in counts),
        kept=sum(c[1] for c in counts),
        rejected=sum(c[2] for c in counts),
        by_code=dict(by_code),
        kept_path=str(kept_path),
        rejected_path=str(rejected_path),
        seconds=time.perf_counter() - t0,
    )
