"""Write filtered records back, keeping every field: JSONL or Parquet.

Records are read by the one source reader (`data.corpus.iter_records`). Filtering must not lose
what it does not understand: a record keeps all its fields, kept records are written in the
input's own format, and rejected ones get two extra fields (`_reject_codes`,
`_reject_reasons`). Text that was not valid UTF-8 arrives with its bytes as surrogate escapes
(rule D230 points at them) and is written back byte for byte.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.data.corpus import kind_of_name, record_line, source_kind
from trainguard.errors import DataError
from trainguard.util.inputs import open_parquet
from trainguard.util.paths import refuse_overwrite

REJECT_FIELDS = ("_reject_codes", "_reject_reasons")
_PARQUET_BATCH = 1024


def output_paths(source: str | Path, out: str | Path) -> tuple[Path, Path, str]:
    """(kept path, rejected path, format) for `--out OUT`.

    OUT named like a JSONL or Parquet file is the kept file and the rejected one sits beside it as
    `<stem>.rejected<suffix>`; any other OUT is a folder holding `kept.<ext>` and `rejected.<ext>`.
    Folders and stdlib are written as JSONL.
    """
    fmt = source_kind(source)
    fmt = fmt if fmt in ("jsonl", "parquet") else "jsonl"
    out = Path(out)
    if kind_of_name(out.name) is not None:
        fmt = kind_of_name(out.name)
        paths = (out, out.with_name(f"{out.stem}.rejected{out.suffix}"))
    else:
        paths = (out / f"kept.{fmt}", out / f"rejected.{fmt}")
    refuse_overwrite({"--out": paths[0], "the rejected file": paths[1]}, {"SOURCE": source})
    return paths[0], paths[1], fmt


def parquet_schemas(source: str | Path) -> tuple[Any, Any]:
    """(kept schema, rejected schema) of a Parquet source: its own columns, plus the reasons."""
    import pyarrow as pa

    schema = open_parquet(source, "data source", DataError).schema_arrow
    rejected = schema
    for name in REJECT_FIELDS:
        rejected = rejected.append(pa.field(name, pa.list_(pa.string())))
    return schema, rejected


class RecordWriter:
    """Writes records in `fmt` to `path`, streaming; Parquet uses `schema` (else the first
    batch's). Callers write to a temporary path from `util.atomic.atomic_paths`, so a failed
    run leaves no half-written output that looks complete."""

    def __init__(self, path: Path, fmt: str, schema: Any = None) -> None:
        self.path, self.fmt, self._schema = Path(path), fmt, schema
        self.count = 0
        self._buffer: list[dict[str, Any]] = []
        self._pq_writer: Any = None
        self._file = open(self.path, "wb") if fmt == "jsonl" else None  # noqa: SIM115

    def write(self, fields: dict[str, Any]) -> None:
        self.count += 1
        if self._file is not None:
            self._file.write(record_line(fields))
        else:
            self._buffer.append(fields)
            if len(self._buffer) >= _PARQUET_BATCH:
                self._flush_parquet()

    def _flush_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._buffer:
            return
        if self._pq_writer is None:
            table = pa.Table.from_pylist(self._buffer, schema=self._schema)
            self._pq_writer = pq.ParquetWriter(self.path, table.schema)
        else:
            table = pa.Table.from_pylist(self._buffer, schema=self._pq_writer.schema)
        self._pq_writer.write_table(table)
        self._buffer = []

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        else:
            self._flush_parquet()
            if self._pq_writer is None:
                import pyarrow as pa
                import pyarrow.parquet as pq

                # No records: still write a valid, empty file with the input's columns.
                schema = self._schema if self._schema is not None else pa.schema([])
                pq.write_table(schema.empty_table(), self.path)
            else:
                self._pq_writer.close()

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
        elif self._pq_writer is not None:
            self._pq_writer.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
