"""Read and write JSONL and Parquet documents, keeping every field and the input's format.

JSONL kept records are copied byte for byte from the input lines (no re-serialisation), Parquet
rows keep the input schema. Blank JSONL lines are not documents and are skipped everywhere, so a
document's position means the same thing to every engine. Spark writes folders of part files;
`read_records` reads a file or such a folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.errors import BadInputError, DataError
from trainguard.util.atomic import check_writable
from trainguard.util.inputs import open_parquet
from trainguard.util.paths import credentials_error, is_url, refuse_overwrite

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}


def detect_format(path: str | Path, must_exist: bool = True) -> str:
    """`jsonl` or `parquet` from the file name (a folder: from its part files)."""
    path = Path(path)
    if must_exist and not path.exists():
        raise DataError(
            f"input {path} does not exist", "give the path of a .jsonl or .parquet file"
        )
    if path.is_dir():
        if path.suffix.lower() in FORMATS:  # a Spark output folder named like a file
            return FORMATS[path.suffix.lower()]
        kinds = {FORMATS.get(p.suffix) for p in _part_files(path)} - {None}
        if len(kinds) == 1:
            return kinds.pop()  # type: ignore[return-value]
    elif path.suffix.lower() in FORMATS:
        return FORMATS[path.suffix.lower()]
    raise BadInputError(
        f"cannot tell the format of {path}: expected a .jsonl, .ndjson or .parquet file",
        "rename the file with one of those extensions, or convert it to JSONL or Parquet",
    )


def _part_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))


def parse_jsonl_line(
    line: bytes | str, where: str, text_field: str, id_field: str = "id"
) -> dict[str, Any]:
    """One JSONL record; errors name `where` (file and line) and the field."""
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{where}: not valid UTF-8 JSON ({e})", "fix or drop that line") from None
    if not isinstance(rec, dict):
        raise DataError(f"{where}: a JSONL record must be an object", "fix that line")
    if not isinstance(rec.get(text_field), str):
        raise DataError(
            f"{where}: no string field {text_field!r}",
            f"give every record a {text_field!r} string, or pass --text-field with the right name",
        )
    for name in (text_field, id_field):
        value = rec.get(name)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise DataError(
                    f"{where}: field {name!r} holds the lone surrogate "
                    f"{value[e.start]!r} (a JSON escape such as \\ud800 that is not valid "
                    "Unicode text)",
                    "fix or drop that line; `trainguard data filter` rejects such documents (D230)",
                ) from None
    return rec


def _jsonl_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) of the non-blank lines."""
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield lineno, line


def iter_batches(
    path: str | Path, fmt: str, text_field: str = "text", id_field: str = "id", size: int = 2048
) -> Iterator[tuple[list[str], list[Any]]]:
    """(texts, ids) in input order, `size` documents at a time; ids are None where absent."""
    path = Path(path)
    texts: list[str] = []
    ids: list[Any] = []
    if fmt == "jsonl":
        for lineno, line in _jsonl_lines(path):
            rec = parse_jsonl_line(line, f"{path}:{lineno}", text_field, id_field)
            texts.append(rec[text_field])
            ids.append(rec.get(id_field))
            if len(texts) == size:
                yield texts, ids
                texts, ids = [], []
        if texts:
            yield texts, ids
        return
    pf = open_parquet(path, "input", DataError)
    names = pf.schema_arrow.names
    if text_field not in names:
        raise DataError(
            f"{path} has no column {text_field!r} (columns: {', '.join(names)})",
            "pass --text-field with the name of the text column",
        )
    cols = [text_field] + ([id_field] if id_field in names else [])
    for batch in pf.iter_batches(batch_size=size, columns=cols):
        t = batch.column(0).to_pylist()
        if any(not isinstance(x, str) for x in t):
            raise DataError(
                f"{path}: column {text_field!r} has a null or non-string value",
                "drop or fill the rows without text",
            )
        yield t, (batch.column(1).to_pylist() if len(cols) == 2 else [None] * len(t))


def write_kept(in_path: str | Path, out_path: str | Path, fmt: str, keep: np.ndarray) -> int:
    """Copy the records where keep[i] is true, in input order; returns how many were written.

    Writes `out_path` as given: callers pass a temporary path from `atomic_paths`."""
    in_path, out_path = Path(in_path), Path(out_path)
    written = 0
    if fmt == "jsonl":
        with open(out_path, "wb") as out:
            for i, (_, line) in enumerate(_jsonl_lines(in_path)):
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
    fmt = detect_format(path)
    records: list[dict[str, Any]] = []
    for f in files:
        if fmt == "jsonl":
            records += [json.loads(line) for _, line in _jsonl_lines(f)]
        else:
            records += open_parquet(f, "input", DataError).read().to_pylist()
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
    other = FORMATS.get(out_path.suffix.lower())
    if other is not None and other != fmt:
        raise BadInputError(
            f"--out {out_path} names {other} but the input is {fmt}; output keeps the input format",
            f"give --out a {'.jsonl' if fmt == 'jsonl' else '.parquet'} name",
        )
