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

import dataclasses
import json
import os
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from trainguard.data.parts import Part, file_parts, jsonl_parts, parquet_parts
from trainguard.errors import DataError
from trainguard.util.hashing import stable_json_hash, stable_u64
from trainguard.util.inputs import open_parquet
from trainguard.util.paths import is_url

Split = Literal["train", "val"]
Kind = Literal["stdlib", "folder", "jsonl", "parquet"]

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
ACCEPTED = (
    "'stdlib', a folder of text files, a JSON Lines file (.jsonl, .ndjson) or a Parquet file "
    "(.parquet, .pq)"
)

# Folders that hold tests, fixtures or IDE test data rather than library source: they are full
# of deliberately odd code (lib2to3's bad-syntax fixtures) and would dominate some modules.
_TEST_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})
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


def stdlib_root() -> Path:
    """The running Python's standard library folder (the embedded corpus)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _walk(
    root: Path, skip_dir: Any, contained: bool = False
) -> tuple[list[tuple[str, Path]], list[str]]:
    """(files, links left out): regular files below `root`, sorted by relative id; folder
    links are never followed (os.walk), nor FIFOs or devices read. `contained`: a file link
    whose target is outside `root` is left out too (its id is in the second list)."""
    out, links_out = [], []
    real_root = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not skip_dir(d)]  # pruned while walking
        for name in filenames:
            path = Path(dirpath) / name
            if name.startswith(".") or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            if contained and path.is_symlink():
                target = os.path.realpath(path)
                if os.path.commonpath([real_root, target]) != real_root:
                    links_out.append(rel)
                    continue
            out.append((rel, path))
    return sorted(out), sorted(links_out)


def stdlib_files() -> list[tuple[str, Path]]:
    """(relative id, path) of the stdlib's `.py` files without test folders, sorted by id."""
    # site-packages can be far larger than the stdlib itself. The stdlib is the interpreter's
    # own: its links (a distribution's sitecustomize.py) are followed.
    files, _ = _walk(stdlib_root(), lambda d: d in _TEST_DIRS or d.endswith("_test"))
    return [(rel, path) for rel, path in files if rel.endswith(".py")]


def folder_files(root: Path) -> list[tuple[str, Path]]:
    """(relative id, path) of a folder's files, sorted; hidden files and folders (.git, .cache)
    are tooling, not corpus. A file link that leads out of the folder is not read (a source
    folder must not pull in files from elsewhere; `links_out` names them)."""
    return _walk(root, lambda d: d.startswith("."), contained=True)[0]


def links_out(source: str | os.PathLike[str]) -> list[str]:
    """The relative ids of the file links of a source folder that `folder_files` leaves out
    because they lead outside it ([] for any other source)."""
    path = Path(source).expanduser()
    if str(source) == "stdlib" or is_url(str(source)) or not path.is_dir():
        return []
    return _walk(path, lambda d: d.startswith("."), contained=True)[1]


def kind_of_name(name: str) -> Literal["jsonl", "parquet"] | None:
    """`jsonl` or `parquet` from a file name's suffix (any case); None for anything else."""
    suffix = Path(name).suffix.lower()
    return (
        "jsonl" if suffix in JSONL_SUFFIXES else "parquet" if suffix in PARQUET_SUFFIXES else None
    )


def source_kind(source: str | os.PathLike[str]) -> Kind:
    """What `source` is; DataError (exit 2) naming the problem when it is none of `ACCEPTED`."""
    source = str(source)
    if source == "stdlib":
        return "stdlib"
    if is_url(source):
        raise DataError(
            f"data source {source!r} is a URL; trainguard reads documents from local files",
            "copy the data to a local folder first (e.g. `aws s3 cp --recursive`) and give its "
            "path (`data dedup --engine spark` reads one object-store file)",
        )
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(f"data source {source!r} does not exist", f"give {ACCEPTED}")
    if path.is_dir():
        return "folder"
    kind = kind_of_name(path.name)
    if kind is None:
        raise DataError(
            f"data source {source!r} is a file but neither JSON Lines nor Parquet "
            f"(suffix {path.suffix!r})",
            f"give {ACCEPTED}, or the folder holding the file",
        )
    return kind


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


def _jsonl_records(
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


def _parquet_records(
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


def _file_records(files: list[tuple[str, Path]]) -> Iterator[Record]:
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
        yield from _file_records(stdlib_files())
    elif kind == "folder":
        yield from _file_records(folder_files(path))
    elif kind == "jsonl":
        yield from _jsonl_records(path, text_field, id_field)
    else:
        yield from _parquet_records(path, text_field, id_field, all_fields)


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


def source_parts(source: str | os.PathLike[str], target_bytes: int = 64 << 20) -> list[Part]:
    """`source` cut into parts of about `target_bytes` that `iter_part_records` (or
    `iter_part`) reads one by one: in order, exactly the records of `iter_records`."""
    kind = source_kind(source)
    path = Path(source).expanduser()
    if kind in ("stdlib", "folder"):
        return file_parts(stdlib_files() if kind == "stdlib" else folder_files(path), target_bytes)
    if kind == "jsonl":
        return jsonl_parts(path, target_bytes)
    meta = open_parquet(path, "data source", DataError).metadata
    bytes_per_row = path.stat().st_size / max(meta.num_rows, 1)
    return parquet_parts(path, max(1, int(target_bytes / max(bytes_per_row, 1.0))))


def source_bytes(source: str | os.PathLike[str]) -> int:
    """The size of a source's files (sizes the parts of the Spark engines)."""
    kind = source_kind(source)
    path = Path(source).expanduser()
    if kind in ("stdlib", "folder"):
        files = stdlib_files() if kind == "stdlib" else folder_files(path)
        return sum(p.stat().st_size for _, p in files)
    return path.stat().st_size


def iter_part_records(
    part: Part, text_field: str = "text", id_field: str = "id", all_fields: bool = True
) -> Iterator[Record]:
    """The records of one part of `source_parts`, read as `iter_records` reads them."""
    if part.kind == "files":
        yield from _file_records([(ident, Path(p)) for ident, p in part.files])
    elif part.kind == "jsonl":
        yield from _jsonl_records(Path(part.path), text_field, id_field, part)
    else:
        yield from _parquet_records(Path(part.path), text_field, id_field, all_fields, part)


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
    kind = source_kind(source)
    if kind == "stdlib":
        files = stdlib_files()
        ident = {"python": sys.version, "root": str(stdlib_root())}
    else:
        path = Path(source).expanduser().resolve()
        files = folder_files(path) if kind == "folder" else [(path.name, path)]
        ident = {"path": str(path), "text_field": text_field}
    if not files:
        raise DataError(
            f"data source {source!r} holds no files",
            "point data.source at a folder that contains text files",
        )
    return stable_json_hash({"kind": kind, **ident, "files": _listing_hash(files)})
