"""Cut one source into ordered parts that can be read independently (the Spark engines).

Reading the parts one after the other yields exactly the documents of reading the whole source,
in the same order, with the same ids and line numbers: a JSONL part is a byte range that starts
and ends at line starts (with the number of its first line), a Parquet part is a run of row
groups (with the index of its first row), a folder part is a run of the sorted file list. Each
reader (`data/corpus.py`, `filters/records.py`) reads a part with the same code it uses for the
whole source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.errors import DataError
from trainguard.util.inputs import open_parquet

_SCAN = 1 << 24  # bytes read at a time while counting lines
_MOST = 64 << 20


def part_bytes(total_bytes: int, slots: int) -> int:
    """Bytes per part for a source of `total_bytes` on `slots` Spark cores: four parts per core
    at least (so every core works and stragglers are short), at most 64 MiB each."""
    return max(1, min(_MOST, total_bytes // (4 * max(slots, 1))))


@dataclass(frozen=True)
class Part:
    """One independently readable piece of a source; `index` is its place in the order."""

    index: int
    kind: str  # "files", "jsonl" or "parquet"
    path: str = ""  # the JSONL or Parquet file
    files: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (id, path) of "files"
    start: int = 0  # jsonl: first byte; parquet: first row group
    stop: int = 0  # jsonl: end byte; parquet: end row group
    first: int = 0  # jsonl: number of the first line (1-based); parquet: index of the first row


def file_parts(files: Sequence[tuple[str, Path]], target_bytes: int) -> list[Part]:
    """Runs of consecutive files of about `target_bytes` each (a file is never split)."""
    parts: list[Part] = []
    run: list[tuple[str, str]] = []
    size = 0
    for ident, path in files:
        run.append((ident, str(path)))
        size += path.stat().st_size
        if size >= target_bytes:
            parts.append(Part(len(parts), "files", files=tuple(run)))
            run, size = [], 0
    if run or not parts:
        parts.append(Part(len(parts), "files", files=tuple(run)))
    return parts


def jsonl_parts(path: Path, target_bytes: int) -> list[Part]:
    """Byte ranges of about `target_bytes` cut at line starts, each with its first line number.

    One pass over the file counts the newlines before every cut (bytes.count: about 1 GB/s).
    """
    total = path.stat().st_size
    parts: list[Part] = []
    start, line = 0, 1
    with open(path, "rb") as f:
        while start < total:
            f.seek(min(start + max(target_bytes, 1), total))
            if f.tell() < total:
                f.readline()  # to the next line start
            stop = f.tell()
            f.seek(start)
            lines, left = 0, stop - start
            while left:
                chunk = f.read(min(left, _SCAN))
                lines += chunk.count(b"\n")
                left -= len(chunk)
            parts.append(Part(len(parts), "jsonl", str(path), start=start, stop=stop, first=line))
            start, line = stop, line + lines
    return parts or [Part(0, "jsonl", str(path), first=1)]


def parquet_parts(path: Path, target_rows: int) -> list[Part]:
    """Runs of whole row groups of about `target_rows` rows, each with its first row index."""
    meta = open_parquet(path, "data source", DataError).metadata
    parts: list[Part] = []
    first = group = row = 0
    for g in range(meta.num_row_groups):
        row += meta.row_group(g).num_rows
        if row - first >= target_rows:
            parts.append(
                Part(len(parts), "parquet", str(path), start=group, stop=g + 1, first=first)
            )
            first, group = row, g + 1
    if group < meta.num_row_groups or not parts:
        stop = meta.num_row_groups
        parts.append(Part(len(parts), "parquet", str(path), start=group, stop=stop, first=first))
    return parts
