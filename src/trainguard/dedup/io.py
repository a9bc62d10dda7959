"""Dedup's inputs and outputs: the input read by the one source reader (`data.corpus`), kept
records written in the input's format, the clusters file, and the Spark output folders.

JSONL kept records are copied byte for byte from the input lines (no re-serialisation), Parquet
rows keep the input schema, a folder or `stdlib` input is written as JSON Lines records
(`{"id", "text"}`). Blank JSONL lines are not documents and are skipped everywhere, so a
document's position means the same thing to every engine. Spark writes folders of part files;
`read_records` reads a file or such a folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.data.corpus import (
    ACCEPTED,
    iter_records,
    jsonl_lines,
    kind_of_name,
    record_line,
    source_kind,
)
from trainguard.errors import BadInputError, DataError
from trainguard.util.atomic import check_writable
from trainguard.util.inputs import open_parquet
from trainguard.util.paths import credentials_error, is_url, refuse_overwrite


def output_format(kind: str) -> str:
    """The format OUT is written in for an input of `kind`: its own, JSONL for text files."""
    return kind if kind in ("jsonl", "parquet") else "jsonl"


def spark_input_format(path: str | Path) -> str:
    """`jsonl` or `parquet` for the Spark engine's one input file (a local path or a URL)."""
    kind = kind_of_name(str(path)) if is_url(path) else source_kind(path)
    if kind in ("jsonl", "parquet"):
        return kind
    raise BadInputError(
        f"the Spark engine reads one JSON Lines or Parquet file, not {path}",
        f"give a .jsonl, .ndjson, .parquet or .pq file, or use --engine local for {ACCEPTED}",
    )


def _part_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))


def iter_batches(
    path: str | Path, text_field: str = "text", id_field: str = "id", size: int = 2048
) -> Iterator[tuple[list[str], list[Any]]]:
    """(texts, ids) of every document in input order, `size` at a time; ids are the records'
    `id_field` values, None where absent."""
    texts: list[str] = []
    ids: list[Any] = []
    for rec in iter_records(path, text_field, id_field, all_fields=False):
        texts.append(rec.text)
        ids.append(rec.fields.get(id_field))
        if len(texts) == size:
            yield texts, ids
            texts, ids = [], []
    if texts:
        yield texts, ids


def write_kept(in_path: str | Path, out_path: str | Path, kind: str, keep: np.ndarray) -> int:
    """Copy the records where keep[i] is true, in input order; returns how many were written.

    `kind` is the input's (`data.corpus.source_kind`). Writes `out_path` as given: callers pass
    a temporary path from `atomic_paths`."""
    in_path, out_path = Path(in_path), Path(out_path)
    written = 0
    if kind in ("jsonl", "folder", "stdlib"):
        lines = (
            (line for _, line in jsonl_lines(in_path))
            if kind == "jsonl"
            else (record_line(rec.fields) for rec in iter_records(in_path))
        )
        with open(out_path, "wb") as out:
            for i, line in enumerate(lines):
                if keep[i]:
                    out.write(line if line.endswith(b"\n") else line + b"\n")
                    written += 1
        return written
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(in_path)
    with pq.ParquetWriter(out_path, pf.schema_arrow) as writer:
        start = 0
        for batch in pf.iter_batches(batch_size=8192):
            mask = pa.array(keep[start : start + batch.num_rows])
            start += batch.num_rows
            kept = batch.filter(mask)
            written += kept.num_rows
            writer.write_batch(kept)
    return written


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """JSON Lines to a local path as given (a temporary one from `atomic_paths`) or a URL."""
    if is_url(path):  # an object store URL (s3://, gs://): no rename there
        import fsspec

        try:
            with fsspec.open(str(path), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        except Exception as e:
            err = credentials_error(e, str(path))
            if err is None:
                raise
            raise err from None
        return
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a JSONL or Parquet file, or of a Spark folder of part files, in order."""
    path = Path(path)
    files = _part_files(path) if path.is_dir() else [path]
    records: list[dict[str, Any]] = []
    for f in files:
        fmt = kind_of_name(path.name) or kind_of_name(f.name)
        if fmt == "jsonl":
            records += [json.loads(line) for _, line in jsonl_lines(f)]
        elif fmt == "parquet":
            records += open_parquet(f, "input", DataError).read().to_pylist()
        else:
            raise DataError(f"cannot tell the format of {f}", "name it .jsonl or .parquet")
    return records


def check_output(
    out_path: str | Path,
    fmt: str,
    in_path: str | Path,
    clusters_path: str | Path | None,
    folder_ok: bool = False,
) -> None:
    """OUT and the clusters file overwrite neither IN nor each other; OUT keeps IN's format
    and is a file unless `folder_ok` (Spark writes a folder, replacing what it held)."""
    out_path = Path(out_path)
    refuse_overwrite(
        {"--out": out_path, "--clusters": clusters_path},
        {"IN": in_path},
        replaced_folders=["--out"] if folder_ok else [],
    )
    # A folder in the way or a read-only folder fails now (exit 1), not after the work.
    for path in ([] if folder_ok else [out_path]) + [clusters_path]:
        if path is not None and not is_url(path):
            check_writable(path)
    other = kind_of_name(out_path.name)
    if other is not None and other != fmt:
        raise BadInputError(
            f"--out {out_path} names {other} but the input is {fmt}; output keeps the input format",
            f"give --out a {'.jsonl' if fmt == 'jsonl' else '.parquet'} name",
        )
