"""What a data source is and which files it holds: the kinds `corpus` accepts (`source_kind`,
`ACCEPTED`), the files of a folder or of the standard library (links out of a folder left out),
the source cut into parts for the Spark engines (`source_parts`), and its fingerprint. The rules
are in `data/corpus.py`'s docstring; `corpus` re-exports these names.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, Literal

from trainguard.data.parts import Part, file_parts, jsonl_parts, parquet_parts
from trainguard.errors import DataError
from trainguard.util.hashing import stable_json_hash
from trainguard.util.inputs import open_parquet
from trainguard.util.paths import is_url

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
