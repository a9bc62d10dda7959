"""Any trainer's line-based metric log: JSON Lines or CSV with a header, whole or followed live.

Rows: one object (or CSV line) per logged step. `normalise` turns a row into (step, numeric
values): the step comes from `step`, `global_step`, `iteration`, `iter` or `_step`, else the
row's position. Rows with a `kind` other than `step` (trainguard's eval and finding rows) are
ignored, except `{"kind": "meta", "data_period_steps": N}`, which gives the known data period.
An `epoch` column gives it too (integer epochs: the step of the first change; fractional epochs
as Hugging Face logs them: step / epoch).
"""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import DataError
from trainguard.metrics.rowjson import MAX_LINE_CHARS, RowRejected, parse_row

STEP_KEYS = ("step", "global_step", "iteration", "iter", "_step")


@dataclass
class LogState:
    """What the reader learned besides the rows: the data period, the row count."""

    data_period: float | None = None
    rows: int = 0
    skipped_rows: int = 0
    _epoch_first: tuple[float, int] | None = None
    keys: set[str] = field(default_factory=set)

    def note_epoch(self, epoch: float, step: int) -> None:
        if self.data_period is not None or not math.isfinite(epoch):
            return
        if epoch != int(epoch):
            if epoch > 0 and step > 0:
                self.data_period = step / epoch
            return
        if self._epoch_first is None:
            self._epoch_first = (epoch, step)
        elif epoch > self._epoch_first[0]:
            first_epoch, first_step = self._epoch_first
            if first_epoch == 0:
                self.data_period = float(step)
            else:
                self.data_period = (step - first_step) / (epoch - first_epoch)


def number(v: Any) -> float | None:
    """A cell as a float: numbers, numeric strings ("nan" and "inf" too); None otherwise."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, float):
        return v
    if isinstance(v, int):
        try:
            return float(v)
        except OverflowError:  # an integer beyond the largest float: non-finite, as R101 sees
            return math.inf if v > 0 else -math.inf
    if isinstance(v, str):
        s = v.strip()
        if not s:
            return None
        try:
            return float(s)  # "nan" and "inf" parse too: R101 wants to see them
        except ValueError:
            return None
    return None


def normalise(row: dict[str, Any], state: LogState) -> tuple[int, dict[str, float | None]] | None:
    """(step, numeric values) of a step row, or None for rows to ignore."""
    kind = row.get("kind")
    if kind is not None and kind != "step":
        if kind == "meta" and number(row.get("data_period_steps")):
            state.data_period = number(row["data_period_steps"])
        return None
    step = None
    for k in STEP_KEYS:
        s = number(row.get(k))
        if s is not None and math.isfinite(s):
            step = int(s)
            break
    if step is None:
        step = state.rows
    state.rows += 1
    values = {k: number(v) for k, v in row.items()}
    state.keys.update(k for k, v in values.items() if v is not None)
    epoch = values.get("epoch")
    if epoch is not None:
        state.note_epoch(epoch, step)
    return step, values


def _jsonl_row(line: str, lineno: int, path: Path, last: bool) -> dict[str, Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        return parse_row(line)  # bounded: length, nesting, numbers too large for a float
    except RowRejected as e:
        if last:
            return None  # a half-written last line of a live or crashed run
        raise DataError(
            f"{path}:{lineno} is {e.reason}"
            if e.reason.startswith("not ")
            else f"{path}:{lineno}: {e.reason}",
            "give a JSON Lines file (one object per line) or a CSV file with a header",
        ) from None


def jsonl_rows(path: Path, text: str) -> Iterator[dict[str, Any]]:
    lines = text.split("\n")  # not splitlines: a JSON string may hold a raw U+2028
    for i, line in enumerate(lines, 1):
        row = _jsonl_row(line, i, path, last=i == len(lines))
        if row is not None:
            yield row


def csv_rows(path: Path, text: str) -> Iterator[dict[str, Any]]:
    delim = "\t" if path.suffix.lower() == ".tsv" else ","
    reader = csv.DictReader(io.StringIO(text), delimiter=delim)
    if not reader.fieldnames:
        raise DataError(f"{path} has no CSV header", "put the column names on the first line")
    yield from reader


def follow_lines(
    path: Path, fmt: str, poll_s: float = 0.2, idle_timeout_s: float | None = None
) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL or CSV log being written, as complete lines arrive; stops after
    `idle_timeout_s` seconds without new data (never, when None)."""
    last_data = time.monotonic()
    header: list[str] | None = None
    pending = ""
    lineno = 0
    with open(path, encoding="utf-8") as fh:
        while True:
            try:
                chunk = fh.read()
            except UnicodeDecodeError as e:  # (a character cut mid-write just waits in the decoder)
                raise DataError(
                    f"metric log {path} is not valid UTF-8 ({e.reason} after line {lineno})",
                    "write the log as UTF-8 text",
                ) from None
            if chunk:
                last_data = time.monotonic()
                pending += chunk
                *lines, pending = pending.split("\n")
                if len(pending) > MAX_LINE_CHARS:  # no newline in sight: do not buffer forever
                    raise DataError(
                        f"{path}:{lineno + len(lines) + 1}: the line is longer than "
                        f"{MAX_LINE_CHARS} characters",
                        "write one JSON object or CSV row per line",
                    )
                for line in lines:
                    lineno += 1
                    if fmt == "csv":
                        cells = next(csv.reader([line])) if line.strip() else []
                        if not cells:
                            continue
                        if header is None:
                            header = cells
                            continue
                        yield dict(zip(header, cells, strict=False))
                    else:
                        row = _jsonl_row(line, lineno, path, last=False)
                        if row is not None:
                            yield row
            else:
                if idle_timeout_s is not None and time.monotonic() - last_data > idle_timeout_s:
                    return
                time.sleep(poll_s)
