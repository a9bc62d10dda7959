"""The one source reader: every command that reads documents reads them here.

`run`, `data prepare`, `check-tokenizer --corpus` (`iter_documents`), `data filter`,
`data inspect` and `data dedup` (`iter_records`) accept the same sources, with the same rules:

- `"stdlib"`: the running Python's standard library source, test folders left out;
- a folder: every file below it, sorted, hidden ones (a name starting with ".") left out, one
  document per file (its id is the relative path); links to folders, FIFOs and devices are not
  read, nor a file link whose target is outside the folder (counted, D105 at `data prepare`);
- a JSON Lines file (`JSONL_SUFFIXES`: .jsonl, .ndjson, any case): one JSON object per line with
  a string `text_field`; blank lines are not records;
- a Parquet file (`PARQUET_SUFFIXES`: .parquet, .pq, any case) with a `text_field` column.

Anything else (another suffix, a URL, a missing path, a file named .parquet that is not Parquet,
a line that is not a JSON object, a record without a string text) is bad input (`DataError`,
exit 2) naming the file and line. Text that is not valid Unicode (invalid UTF-8 bytes in a file
or a line, a lone surrogate from a JSON escape such as \\ud800) is never fatal and never lost:
it is read with its bytes kept as surrogate escapes (they write back byte for byte) and the
record is marked `unicode=False`; training sets it aside and counts it (`CorpusStats`), the
filters reject it with D230, dedup compares it like any other. Every source yields records in a
deterministic order, so the same data always gives the same tokenizer and the same shards.

The Spark engines read a source cut into parts (`source_parts`, `data/parts.py`: runs of files,
JSONL byte ranges, Parquet row groups) with the same readers (`iter_part_records`,
`iter_part`): the parts read in order are exactly the records of the whole source.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from trainguard.data.parts import Part
from trainguard.data.records import (
    CorpusStats,
    Document,
    Record,
    fields_record,
    file_records,
    jsonl_lines,
    jsonl_record,
    jsonl_records,
    parquet_records,
    record_line,
)
from trainguard.data.sources import (
    ACCEPTED,
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    Kind,
    folder_files,
    kind_of_name,
    links_out,
    source_bytes,
    source_fingerprint,
    source_kind,
    source_parts,
    stdlib_files,
    stdlib_root,
)
from trainguard.errors import DataError
from trainguard.util.hashing import stable_u64

# The one reader's names, wherever they are defined (`sources.py`: what a source is;
# `records.py`: one file's records): callers import them from here.
__all__ = [
    "ACCEPTED",
    "JSONL_SUFFIXES",
    "PARQUET_SUFFIXES",
    "CorpusStats",
    "Document",
    "Kind",
    "Record",
    "Split",
    "fields_record",
    "folder_files",
    "iter_documents",
    "iter_part",
    "iter_part_records",
    "iter_records",
    "jsonl_lines",
    "jsonl_record",
    "kind_of_name",
    "links_out",
    "no_documents",
    "record_line",
    "source_bytes",
    "source_fingerprint",
    "source_kind",
    "source_parts",
    "split_of",
    "stdlib_files",
    "stdlib_root",
]

Split = Literal["train", "val"]


def iter_records(
    source: str | os.PathLike[str],
    text_field: str = "text",
    id_field: str = "id",
    all_fields: bool = True,
) -> Iterator[Record]:
    """Every record of `source` in order (empty and non-Unicode ones included, marked).

    `all_fields=False` reads only the text, id and source columns of a Parquet file."""
    kind = source_kind(source)
    path = Path(source).expanduser()
    if kind == "stdlib":
        yield from file_records(stdlib_files())
    elif kind == "folder":
        yield from file_records(folder_files(path))
    elif kind == "jsonl":
        yield from jsonl_records(path, text_field, id_field)
    else:
        yield from parquet_records(path, text_field, id_field, all_fields)


def iter_documents(
    source: str, text_field: str = "text", stats: CorpusStats | None = None
) -> Iterator[Document]:
    """The documents a model trains on: the records of `source` that hold Unicode text, in
    order; empty and non-Unicode ones are set aside and counted in `stats`.

    Raises `DataError` when the source is missing, or holds no usable document.
    """
    stats = stats if stats is not None else CorpusStats()
    yield from _documents(iter_records(source, text_field, all_fields=False), stats)
    if stats.docs == 0:
        raise no_documents(source, stats)


def _documents(records: Iterator[Record], stats: CorpusStats) -> Iterator[Document]:
    """The records that hold Unicode text; empty and non-Unicode ones counted in `stats`."""
    for rec in records:
        if not rec.unicode:
            stats.skipped_non_utf8 += 1
            continue
        if not rec.text:
            stats.skipped_empty += 1
            continue
        stats.docs += 1
        stats.bytes += len(rec.text.encode("utf-8"))
        yield Document(rec.id, rec.text, rec.source)


def no_documents(source: str, stats: CorpusStats) -> DataError:
    """The error for a source that holds no usable document (after reading all of it)."""
    skipped = f" ({stats.skipped_non_utf8} not valid UTF-8)" if stats.skipped_non_utf8 else ""
    return DataError(
        f"data source {source!r} holds no non-empty document{skipped}",
        "point data.source at UTF-8 text: a folder of text files, JSONL or Parquet",
    )


def iter_part_records(
    part: Part, text_field: str = "text", id_field: str = "id", all_fields: bool = True
) -> Iterator[Record]:
    """The records of one part of `source_parts`, read as `iter_records` reads them."""
    if part.kind == "files":
        yield from file_records([(ident, Path(p)) for ident, p in part.files])
    elif part.kind == "jsonl":
        yield from jsonl_records(Path(part.path), text_field, id_field, part)
    else:
        yield from parquet_records(Path(part.path), text_field, id_field, all_fields, part)


def iter_part(part: Part, text_field: str, stats: CorpusStats) -> Iterator[Document]:
    """The documents of one part of `source_parts`, counted in `stats` as `iter_documents`
    counts them (the caller checks that the parts together hold a document: `no_documents`)."""
    yield from _documents(iter_part_records(part, text_field, all_fields=False), stats)


def split_of(doc_id: str, val_fraction: float) -> Split:
    """`"val"` for a stable `val_fraction` share of document ids, else `"train"`.

    A hash of the id, not of the position, so adding documents never moves old ones across
    the split (no validation leakage when a corpus grows).
    """
    return "val" if stable_u64(doc_id) < val_fraction * 2.0**64 else "train"
