"""Reading files users hand to trainguard, with errors that say exactly what is wrong.

"does not exist" is said only of a path that does not exist: a folder where a file is
expected, a device, a file that is not UTF-8 or not Parquet each get their own message, and
all of them are bad input (exit 2), never a traceback.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from trainguard.errors import BadInputError


def require_file(
    path: str | os.PathLike[str],
    what: str,
    fix: str,
    error: type[BadInputError] = BadInputError,
) -> Path:
    """`path` if it is a regular file; else `error` naming what is wrong with it."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise error(f"{what} {path} is a broken symbolic link", fix) from None
        raise error(f"{what} {path} does not exist", fix) from None
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}", fix) from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {path} is a folder, not a file", fix)
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {path} is not a regular file (a device, pipe or socket)", fix)
    return path


def decode_utf8(data: bytes, what: str, fix: str, error: type[BadInputError]) -> str:
    """`data` as text; `error` naming the first byte that is not UTF-8 and its line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(
            f"{what} is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}, "
            f"line {line})",
            f"save it as UTF-8; {fix}" if fix else "save it as UTF-8",
        ) from None


def read_text(
    path: str | os.PathLike[str],
    what: str,
    fix: str = "",
    error: type[BadInputError] = BadInputError,
) -> str:
    """The UTF-8 text of the file `path` (a recipe, spec, CSV, metric log ...).

    Raises `error` (a BadInputError) when it is missing, not a file, unreadable or not UTF-8.
    """
    path = require_file(path, what, fix or f"give the path of the {what}", error)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}", fix) from None
    return decode_utf8(data, f"{what} {path}", fix, error)


def open_parquet(
    path: str | os.PathLike[str], what: str = "input", error: type[BadInputError] = BadInputError
) -> Any:
    """A `pyarrow.parquet.ParquetFile`; `error` when the file is not Parquet or unreadable."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = require_file(path, what, "give the path of a Parquet file", error)
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise error(
            f"{what} {path} is not a readable Parquet file ({e})",
            "give a Parquet file (written by pyarrow, pandas or Spark), or rename a JSON "
            "Lines file to .jsonl",
        ) from None
