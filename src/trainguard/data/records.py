"""The records of one source file: JSON Lines lines, Parquet rows and whole text files read as
`Record`s (every field kept; text that is not valid Unicode kept as surrogate escapes and
marked), and a record's fields written back byte for byte (`record_line`). The Spark engines
parse their lines and rows with the same `jsonl_record` and `fields_record`; `data/corpus.py`
chooses the reader for a source and re-exports these names.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainguard.data.parts import Part
from trainguard.errors import DataError
from trainguard.util.inputs import open_parquet

_PARQUET_BATCH = 2048


@dataclass(frozen=True)
class Document:
    """One document: a stable `id`, its text, and the source label used for shuffle quality."""

    id: str
    text: str
    source: str


@dataclass(frozen=True)
class Record:
    """One record of a source with every field it holds (`fields`), for the commands that write
    records back (filter, dedup) or show them (inspect)."""

    id: str
    text: str
    source: str
    fields: dict[str, Any]
    where: str
    """Where it is, for messages: `path:line`, `path row N`, or the file's id."""
    unicode: bool = True
    """False: its text, id or source is not valid Unicode (kept as surrogate escapes)."""


@dataclass
class CorpusStats:
    """What reading a corpus saw: documents kept, skipped for bad encoding, and UTF-8 bytes."""

    docs: int = 0
    skipped_non_utf8: int = 0
    skipped_empty: int = 0
    bytes: int = 0
    skipped_links: int = 0
    """File links of a source folder that lead out of it: not read (D105)."""

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> CorpusStats:
        return cls(**{k: int(d.get(k, 0)) for k in cls.__dataclass_fields__})


def _decode(raw: bytes) -> tuple[str, bool]:
    """(text, valid): invalid UTF-8 bytes are kept as surrogate escapes."""
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="surrogateescape"), False


def _encodable(*values: Any) -> bool:
    try:
        for v in values:
            if isinstance(v, str) and not v.isascii():
                v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def jsonl_lines(
    path: Path, start: int = 0, stop: int | None = None, first_line: int = 1
) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) of the lines that are records (not blank), in file order: those
    in bytes [start, stop), whole lines (a part of `parts.jsonl_parts`), numbered from
    `first_line`."""
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        for lineno, raw in enumerate(f, start=first_line):
            if stop is not None and pos >= stop:
                break
            pos += len(raw)
            if raw.strip():
                yield lineno, raw


def fields_record(
    fields: dict[str, Any],
    where: str,
    default: tuple[str, str],
    text_field: str = "text",
    id_field: str = "id",
) -> Record:
    """A record from its fields (a JSON object, a Parquet row); `default` is the (id, source
    label) when they are absent. The Spark engines build their records with it too."""
    text = fields.get(text_field)
    if text is None and text_field in fields:
        text = ""  # a null text is an empty document (counted, flagged, never silently lost)
    if not isinstance(text, str | bytes | bytearray):
        found = sorted(k for k, v in fields.items() if isinstance(v, str))
        raise DataError(
            f"{where} has no string field {text_field!r} (string fields: {found})",
            f"give every record a {text_field!r} string, or name the text field "
            "(data.text_field, --text-field)",
        )
    valid = True
    if isinstance(text, bytes | bytearray):  # a binary column: the same rule as files
        text, valid = _decode(bytes(text))
    ident, label = fields.get(id_field), fields.get("source")
    doc_id = str(ident) if ident is not None else default[0]
    source = label if isinstance(label, str) else default[1]
    return Record(doc_id, text, source, fields, where, valid and _encodable(text, doc_id, source))


def jsonl_record(
    line: str, where: str, default: tuple[str, str], text_field: str = "text", id_field: str = "id"
) -> Record:
    """One JSON Lines record (a line already decoded); errors name `where`. The Spark engines
    parse their lines with it too."""
    try:
        fields = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{where} is not valid JSON ({e.msg})", "write one JSON object per line (JSON Lines)"
        ) from None
    if not isinstance(fields, dict):
        raise DataError(f"{where} is not a JSON object", "write one JSON object per line")
    return fields_record(fields, where, default, text_field, id_field)


def jsonl_records(
    path: Path, text_field: str, id_field: str, part: Part | None = None
) -> Iterator[Record]:
    lines = jsonl_lines(path, part.start, part.stop, part.first) if part else jsonl_lines(path)
    for lineno, raw in lines:
        line, valid = _decode(raw)
        default = (f"{path.name}:{lineno}", path.name)
        rec = jsonl_record(line, f"{path}:{lineno}", default, text_field, id_field)
        yield rec if valid else dataclasses.replace(rec, unicode=False)


def record_line(fields: dict[str, Any]) -> bytes:
    """`fields` as a JSON Lines line that reads back as the same record: text that was not
    UTF-8 gets its original bytes back; lone surrogates from JSON escapes stay escapes."""
    text = json.dumps(fields, ensure_ascii=False)
    try:
        return text.encode("utf-8", errors="surrogateescape") + b"\n"
    except UnicodeEncodeError:
        return json.dumps(fields, ensure_ascii=True).encode("ascii") + b"\n"


def parquet_records(
    path: Path, text_field: str, id_field: str, all_fields: bool, part: Part | None = None
) -> Iterator[Record]:
    """The records of the file, or of the row groups [part.start, part.stop) of a part."""
    pf = open_parquet(path, "data source", DataError)
    names = pf.schema_arrow.names
    if text_field not in names:
        raise DataError(
            f"{path} has no column {text_field!r} (columns: {', '.join(names)})",
            "name the column that holds the text (data.text_field, --text-field)",
        )
    wanted = dict.fromkeys([text_field, id_field, "source"])
    columns = None if all_fields else [c for c in wanted if c in names]
    row = part.first if part else 0
    groups = list(range(part.start, part.stop)) if part else None
    # Batches keep memory flat on large files; pyarrow validates UTF-8 for string columns.
    for batch in pf.iter_batches(batch_size=_PARQUET_BATCH, columns=columns, row_groups=groups):
        for fields in batch.to_pylist():
            default = (f"{path.name}:{row}", path.name)
            yield fields_record(fields, f"{path} row {row}", default, text_field, id_field)
            row += 1


def file_records(files: list[tuple[str, Path]]) -> Iterator[Record]:
    for doc_id, path in files:
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise DataError(
                f"cannot read corpus file {path}: {e.strerror or e}",
                "fix the file's permissions or remove it from the source folder",
            ) from e
        text, valid = _decode(raw)
        yield Record(doc_id, text, doc_id, {"id": doc_id, "text": text}, doc_id, valid)
