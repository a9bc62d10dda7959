"""Documents from the embedded corpus (the stdlib's own source) or the user's data.

Sources: `"stdlib"`, a folder of text files, a `.jsonl` file, a `.parquet` file. Every source
yields documents in a deterministic order (sorted paths, file order), so the same data always
gives the same tokenizer and the same shards. Files that are not valid UTF-8 are skipped and
counted in `CorpusStats`, never fatal: one odd file must not stop a run, but it is reported.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from trainguard.data.parts import Part, file_parts, jsonl_parts, parquet_parts
from trainguard.errors import DataError
from trainguard.util.hashing import stable_json_hash, stable_u64
from trainguard.util.inputs import open_parquet
from trainguard.util.paths import is_url

Split = Literal["train", "val"]

# Folders that hold tests, fixtures or IDE test data rather than library source: they are full
# of deliberately odd code (lib2to3's bad-syntax fixtures) and would dominate some modules.
_TEST_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})
_PARQUET_BATCH = 4096


@dataclass(frozen=True)
class Document:
    """One document: a stable `id`, its text, and the source label used for shuffle quality."""

    id: str
    text: str
    source: str


@dataclass
class CorpusStats:
    """What reading a corpus saw: documents kept, skipped for bad encoding, and UTF-8 bytes."""

    docs: int = 0
    skipped_non_utf8: int = 0
    skipped_empty: int = 0
    bytes: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> CorpusStats:
        return cls(**{k: int(d.get(k, 0)) for k in cls.__dataclass_fields__})


def stdlib_root() -> Path:
    """The running Python's standard library folder (the embedded corpus)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _skipped_dir(name: str) -> bool:
    return name in _TEST_DIRS or name.endswith("_test")


def stdlib_files() -> list[tuple[str, Path]]:
    """(relative id, path) of the stdlib's `.py` files without test folders, sorted by id."""
    root = stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruned while walking: site-packages can be far larger than the stdlib itself.
        dirnames[:] = [d for d in dirnames if not _skipped_dir(d)]
        for name in filenames:
            path = Path(dirpath) / name
            if name.endswith(".py") and path.is_file():
                out.append((path.relative_to(root).as_posix(), path))
    return sorted(out)


def _folder_files(root: Path) -> list[tuple[str, Path]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Hidden folders (.git, .cache) are tooling, not corpus.
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            path = Path(dirpath) / name
            if not name.startswith(".") and path.is_file():
                out.append((path.relative_to(root).as_posix(), path))
    return sorted(out)


def _kind(source: str) -> Literal["stdlib", "folder", "jsonl", "parquet"]:
    if source == "stdlib":
        return "stdlib"
    if is_url(source):
        raise DataError(
            f"data source {source!r} is a URL; data preparation reads local files",
            "copy the data to a local folder first (e.g. `aws s3 cp --recursive`) and set "
            "data.source to it",
        )
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(
            f"data source {source!r} does not exist",
            "set data.source to 'stdlib', a folder of text files, a .jsonl or a .parquet file",
        )
    if path.is_dir():
        return "folder"
    if path.suffix == ".jsonl":
        return "jsonl"
    if path.suffix == ".parquet":
        return "parquet"
    raise DataError(
        f"data source {source!r} is a file but neither .jsonl nor .parquet",
        "give a .jsonl file (one JSON object per line), a .parquet file, or the folder holding it",
    )


def _decode(raw: bytes, stats: CorpusStats) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        stats.skipped_non_utf8 += 1
        return None


def _files_docs(files: list[tuple[str, Path]], stats: CorpusStats) -> Iterator[Document]:
    for doc_id, path in files:
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise DataError(
                f"cannot read corpus file {path}: {e.strerror or e}",
                "fix the file's permissions or remove it from the source folder",
            ) from e
        text = _decode(raw, stats)
        if text is not None:
            yield Document(doc_id, text, doc_id)


def _jsonl_docs(
    path: Path,
    text_field: str,
    stats: CorpusStats,
    start: int = 0,
    stop: int | None = None,
    first_line: int = 1,
) -> Iterator[Document]:
    """The documents of the lines in bytes [start, stop) (whole lines; `parts.jsonl_parts`)."""
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        for lineno, raw in enumerate(f, start=first_line):
            if stop is not None and pos >= stop:
                break
            pos += len(raw)
            line = _decode(raw, stats)
            if line is None or not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{path}:{lineno} is not valid JSON ({e.msg})",
                    "write one JSON object per line (JSON Lines)",
                ) from None
            if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
                raise DataError(
                    f"{path}:{lineno} has no string field {text_field!r}",
                    f"give every line a {text_field!r} string or set data.text_field",
                )
            doc_id = str(obj["id"]) if obj.get("id") is not None else f"{path.name}:{lineno}"
            label = obj.get("source") if isinstance(obj.get("source"), str) else path.name
            for name, value in ((text_field, obj[text_field]), ("id", doc_id), ("source", label)):
                if not _encodable(value):
                    raise DataError(
                        f"{path}:{lineno}: field {name!r} holds a lone surrogate (a JSON escape "
                        "such as \\ud800 that is not valid Unicode text)",
                        "fix or drop that line; `trainguard data filter` rejects such "
                        "documents (D230)",
                    )
            yield Document(doc_id, obj[text_field], label)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parquet_docs(
    path: Path,
    text_field: str,
    stats: CorpusStats,
    groups: tuple[int, int] | None = None,
    first_row: int = 0,
) -> Iterator[Document]:
    """The documents of row groups [groups[0], groups[1]) (all when None)."""
    pf = open_parquet(path, "data source", DataError)
    names = pf.schema_arrow.names
    if text_field not in names:
        raise DataError(
            f"{path} has no column {text_field!r} (columns: {', '.join(names)})",
            "set data.text_field to the column holding the text",
        )
    columns = [text_field] + [c for c in ("id", "source") if c in names and c != text_field]
    row_groups = None if groups is None else list(range(*groups))
    row = first_row
    # Batches keep memory flat on large files; pyarrow validates UTF-8 for string columns.
    for batch in pf.iter_batches(batch_size=_PARQUET_BATCH, columns=columns, row_groups=row_groups):
        cols = {c: batch.column(c).to_pylist() for c in columns}
        for i, text in enumerate(cols[text_field]):
            ident = cols["id"][i] if "id" in cols else None
            doc_id = str(ident) if ident is not None else f"{path.name}:{row}"
            label = cols["source"][i] if "source" in cols else None
            row += 1
            if isinstance(text, bytes):  # a binary column: same rule as files
                text = _decode(text, stats)
            if text is not None:
                yield Document(doc_id, text, str(label) if label is not None else path.name)


def _counted(docs: Iterator[Document], stats: CorpusStats) -> Iterator[Document]:
    """Skip empty documents; count the kept ones and their UTF-8 bytes."""
    for doc in docs:
        if not doc.text:
            stats.skipped_empty += 1
            continue
        stats.docs += 1
        stats.bytes += len(doc.text.encode("utf-8"))
        yield doc


def _no_documents(source: str, stats: CorpusStats) -> DataError:
    skipped = f" ({stats.skipped_non_utf8} not valid UTF-8)" if stats.skipped_non_utf8 else ""
    return DataError(
        f"data source {source!r} holds no non-empty document{skipped}",
        "point data.source at UTF-8 text: a folder of text files, JSONL or Parquet",
    )


def iter_documents(
    source: str, text_field: str = "text", stats: CorpusStats | None = None
) -> Iterator[Document]:
    """Documents of `source` in a deterministic order; empty documents are skipped.

    Raises `DataError` when the source is missing, or holds no usable document.
    """
    stats = stats if stats is not None else CorpusStats()
    kind = _kind(source)
    path = Path(source).expanduser()
    if kind == "stdlib":
        docs: Iterator[Document] = _files_docs(stdlib_files(), stats)
    elif kind == "folder":
        docs = _files_docs(_folder_files(path), stats)
    elif kind == "jsonl":
        docs = _jsonl_docs(path, text_field, stats)
    else:
        docs = _parquet_docs(path, text_field, stats)
    yield from _counted(docs, stats)
    if stats.docs == 0:
        raise _no_documents(source, stats)


def source_parts(source: str, target_bytes: int = 64 << 20) -> list[Part]:
    """`source` cut into parts of about `target_bytes` that `iter_part` reads one by one: in
    order, they are exactly the documents of `iter_documents` (the Spark engine's input)."""
    kind = _kind(source)
    path = Path(source).expanduser()
    if kind in ("stdlib", "folder"):
        return file_parts(stdlib_files() if kind == "stdlib" else _folder_files(path), target_bytes)
    if kind == "jsonl":
        return jsonl_parts(path, target_bytes)
    meta = open_parquet(path, "data source", DataError).metadata
    bytes_per_row = path.stat().st_size / max(meta.num_rows, 1)
    return parquet_parts(path, max(1, int(target_bytes / max(bytes_per_row, 1.0))))


def source_bytes(source: str) -> int:
    """The size of a source's files (sizes parts for the Spark engines)."""
    if source == "stdlib":
        return sum(p.stat().st_size for _, p in stdlib_files())
    path = Path(source).expanduser()
    if path.is_dir():
        return sum(p.stat().st_size for _, p in _folder_files(path))
    return path.stat().st_size


def iter_part(part: Part, text_field: str, stats: CorpusStats) -> Iterator[Document]:
    """The documents of one part of `source_parts`, counted in `stats` as `iter_documents`
    counts them (the caller checks that the parts together hold a document)."""
    if part.kind == "files":
        docs = _files_docs([(ident, Path(p)) for ident, p in part.files], stats)
    elif part.kind == "jsonl":
        docs = _jsonl_docs(Path(part.path), text_field, stats, part.start, part.stop, part.first)
    else:
        docs = _parquet_docs(
            Path(part.path), text_field, stats, (part.start, part.stop), part.first
        )
    yield from _counted(docs, stats)


def split_of(doc_id: str, val_fraction: float) -> Split:
    """`"val"` for a stable `val_fraction` share of document ids, else `"train"`.

    A hash of the id, not of the position, so adding documents never moves old ones across
    the split (no validation leakage when a corpus grows).
    """
    return "val" if stable_u64(doc_id) < val_fraction * 2.0**64 else "train"


def _listing_hash(files: list[tuple[str, Path]]) -> str:
    rows = []
    for rel, path in files:
        st = path.stat()
        rows.append((rel, st.st_size, st.st_mtime_ns))
    return stable_json_hash(rows)


def source_fingerprint(source: str, text_field: str = "text") -> str:
    """A cheap fingerprint that changes when the corpus may have changed (size, mtime, paths).

    Stat-based, not content-based, so it costs milliseconds on the stdlib; touching a file
    only costs a re-prepare.
    """
    kind = _kind(source)
    if kind == "stdlib":
        files = stdlib_files()
        ident = {"python": sys.version, "root": str(stdlib_root())}
    else:
        path = Path(source).expanduser().resolve()
        files = _folder_files(path) if kind == "folder" else [(path.name, path)]
        ident = {"path": str(path), "text_field": text_field}
    if not files:
        raise DataError(
            f"data source {source!r} holds no files",
            "point data.source at a folder that contains text files",
        )
    return stable_json_hash({"kind": kind, **ident, "files": _listing_hash(files)})
