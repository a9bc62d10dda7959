"""Read and write documents as records that keep every field: JSONL, Parquet, or a text folder.

Filtering must not lose what it does not understand: a record keeps all its fields, kept records
are written in the input's own format, and rejected ones get two extra fields (`_reject_codes`,
`_reject_reasons`). JSONL lines are decoded with `surrogateescape`: invalid UTF-8 bytes survive as
lone surrogates (rule D230 points at them) and are written back byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.data.parts import Part, file_parts
from trainguard.errors import DataError
from trainguard.util.inputs import open_parquet
from trainguard.util.paths import is_url, refuse_overwrite

REJECT_FIELDS = ("_reject_codes", "_reject_reasons")
_PARQUET_BATCH = 1024


@dataclass
class Record:
    """One document: its id, its text, and every field of the source record."""

    id: str
    text: str
    fields: dict[str, Any]


def source_format(source: str | Path) -> str:
    """`jsonl`, `parquet`, `folder` or `stdlib`; a missing path raises DataError."""
    if str(source) == "stdlib":
        return "stdlib"
    if is_url(source):
        raise DataError(
            f"data source {source} is a URL; filtering and inspection read local files",
            "copy the data to a local disk first (e.g. `aws s3 cp`) and give its path",
        )
    path = Path(source)
    if not path.exists():
        raise DataError(
            f"data source {path} does not exist",
            "give a .jsonl or .parquet file, a folder of text files, or 'stdlib'",
        )
    if path.is_dir():
        return "folder"
    if path.suffix == ".jsonl" or path.name.endswith(".jsonl.txt"):
        return "jsonl"
    if path.suffix in (".parquet", ".pq"):
        return "parquet"
    raise DataError(
        f"cannot read {path}: unknown format {path.suffix!r}",
        "use a .jsonl file (one JSON object per line), a .parquet file, or a folder",
    )


def iter_records(source: str | Path, text_field: str = "text") -> Iterator[Record]:
    """Every document of `source` as a Record, in source order."""
    fmt = source_format(source)
    if fmt == "jsonl":
        yield from _iter_jsonl(Path(source), text_field)
    elif fmt == "parquet":
        yield from _iter_parquet(Path(source), text_field)
    elif fmt == "folder":
        yield from _iter_files(_folder_files(Path(source)))
    else:
        # The embedded corpus exactly as `trainguard run` reads it (test folders excluded).
        from trainguard.data.corpus import iter_documents

        yield from map(_stdlib_record, iter_documents("stdlib"))


def _stdlib_record(doc: Any) -> Record:
    return Record(doc.id, doc.text, {"id": doc.id, "text": doc.text, "source": doc.source})


def record_parts(source: str | Path, target_bytes: int) -> list[Part]:
    """`source` cut into parts that `iter_record_part` reads one by one: in order, exactly the
    records of `iter_records` (the Spark engine's input)."""
    fmt = source_format(source)
    if fmt == "folder":
        return file_parts(_folder_files(Path(source)), target_bytes)
    from trainguard.data.corpus import source_parts

    return source_parts(str(source), target_bytes)


def iter_record_part(part: Part, fmt: str, text_field: str) -> Iterator[Record]:
    """The records of one part of `record_parts` for a source of format `fmt`."""
    if fmt == "jsonl":
        yield from _iter_jsonl(Path(part.path), text_field, part.start, part.stop, part.first)
    elif fmt == "parquet":
        yield from _iter_parquet(Path(part.path), text_field, (part.start, part.stop), part.first)
    elif fmt == "folder":
        yield from _iter_files([(ident, Path(p)) for ident, p in part.files])
    else:
        from trainguard.data.corpus import CorpusStats, iter_part

        yield from map(_stdlib_record, iter_part(part, "text", CorpusStats()))


def _text_of(fields: dict[str, Any], text_field: str, where: str) -> str:
    text = fields.get(text_field)
    if not isinstance(text, str):
        found = sorted(k for k, v in fields.items() if isinstance(v, str))
        raise DataError(
            f"{where} has no string field {text_field!r} (string fields: {found})",
            f"pass --text-field with the field that holds the text (one of {found})",
        )
    return text


def _iter_jsonl(
    path: Path, text_field: str, start: int = 0, stop: int | None = None, first_line: int = 1
) -> Iterator[Record]:
    """The records of the lines in bytes [start, stop) (whole lines; `parts.jsonl_parts`)."""
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        for lineno, raw in enumerate(f, first_line):
            if stop is not None and pos >= stop:
                break
            pos += len(raw)
            if not raw.strip():
                continue
            line = raw.decode("utf-8", errors="surrogateescape")
            try:
                fields = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{path}:{lineno} is not valid JSON ({e.msg})",
                    "write one JSON object per line (JSON Lines)",
                ) from None
            if not isinstance(fields, dict):
                raise DataError(f"{path}:{lineno} is not a JSON object", "one object per line")
            text = _text_of(fields, text_field, f"{path}:{lineno}")
            yield Record(str(fields.get("id", f"{path.name}:{lineno}")), text, fields)


def _iter_parquet(
    path: Path, text_field: str, groups: tuple[int, int] | None = None, first_row: int = 0
) -> Iterator[Record]:
    """The records of row groups [groups[0], groups[1]) (all when None)."""
    pf = open_parquet(path, "data source", DataError)
    if text_field not in pf.schema_arrow.names:
        raise DataError(
            f"{path} has no column {text_field!r} (columns: {pf.schema_arrow.names})",
            f"pass --text-field with one of {pf.schema_arrow.names}",
        )
    row = first_row
    row_groups = None if groups is None else list(range(*groups))
    for batch in pf.iter_batches(batch_size=_PARQUET_BATCH, row_groups=row_groups):
        for fields in batch.to_pylist():
            text = _text_of(fields, text_field, f"{path} row {row}")
            yield Record(str(fields.get("id", f"{path.name}:{row}")), text, fields)
            row += 1


def _folder_files(root: Path) -> list[tuple[str, Path]]:
    """(relative id, path) of a folder's files, sorted, hidden ones left out."""
    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if not any(part.startswith(".") for part in path.relative_to(root).parts):
            out.append((path.relative_to(root).as_posix(), path))
    return out


def _iter_files(files: list[tuple[str, Path]]) -> Iterator[Record]:
    for rel, path in files:
        data = path.read_bytes()
        if b"\x00" in data[:1024]:
            continue  # binary file, not text
        text = data.decode("utf-8", errors="surrogateescape")
        yield Record(rel, text, {"id": rel, "text": text})


def output_paths(source: str | Path, out: str | Path) -> tuple[Path, Path, str]:
    """(kept path, rejected path, format) for `--out OUT`.

    OUT ending in .jsonl/.parquet is the kept file and the rejected one sits beside it as
    `<stem>.rejected<suffix>`; any other OUT is a folder holding `kept.<ext>` and `rejected.<ext>`.
    Folders and stdlib are written as JSONL.
    """
    fmt = source_format(source)
    fmt = fmt if fmt in ("jsonl", "parquet") else "jsonl"
    out = Path(out)
    if out.suffix in (".jsonl", ".parquet"):
        fmt = out.suffix[1:]
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
            self._file.write(_jsonl_line(fields))
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


def _jsonl_line(fields: dict[str, Any]) -> bytes:
    text = json.dumps(fields, ensure_ascii=False)
    try:
        # Surrogate escapes go back to the original (invalid) bytes.
        return text.encode("utf-8", errors="surrogateescape") + b"\n"
    except UnicodeEncodeError:
        # Lone surrogates that were not escapes (JSON "\ud800"): keep them as JSON escapes.
        return json.dumps(fields, ensure_ascii=True).encode("ascii") + b"\n"
