"""Read a metric log from any trainer: JSON Lines or CSV with a header, whole or followed live.

Rows: one object (or CSV line) per logged step. The step comes from `step`, `global_step`,
`iteration`, `iter` or `_step`, else the row's position. Rows with a `kind` other than `step`
(trainguard's eval and finding rows) are ignored, except `{"kind": "meta", "data_period_steps": N}`,
which gives the known data period. An `epoch` column gives it too (integer epochs: the step of
the first change; fractional epochs as Hugging Face logs them: step / epoch).
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import DataError
from trainguard.monitors.monitor_set import MetricKind, infer_kind

STEP_KEYS = ("step", "global_step", "iteration", "iter", "_step")
KNOWN_METRICS: dict[str, MetricKind] = {
    "loss": "loss",
    "train_loss": "loss",
    "train/loss": "loss",
    "training_loss": "loss",
    "grad_norm": "grad_norm",
    "gradient_norm": "grad_norm",
    "train/grad_norm": "grad_norm",
    "tokens_per_s": "throughput",
    "tokens_per_sec": "throughput",
    "train/tokens_per_s": "throughput",
    "throughput": "throughput",
}


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


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
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
        if kind == "meta" and _num(row.get("data_period_steps")):
            state.data_period = _num(row["data_period_steps"])
        return None
    step = None
    for k in STEP_KEYS:
        s = _num(row.get(k))
        if s is not None and math.isfinite(s):
            step = int(s)
            break
    if step is None:
        step = state.rows
    state.rows += 1
    values = {k: _num(v) for k, v in row.items()}
    state.keys.update(k for k, v in values.items() if v is not None)
    epoch = values.get("epoch")
    if epoch is not None:
        state.note_epoch(epoch, step)
    return step, values


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    with open(path, encoding="utf-8", errors="replace") as fh:
        head = fh.read(4096).lstrip()
    return "jsonl" if head.startswith("{") else "csv"


def _jsonl_row(line: str, lineno: int, path: Path, last: bool) -> dict[str, Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        if last:
            return None  # a half-written last line of a live or crashed run
        raise DataError(
            f"{path}:{lineno} is not valid JSON ({e.msg})",
            "give a JSON Lines file (one object per line) or a CSV file with a header",
        ) from None
    if not isinstance(row, dict):
        raise DataError(f"{path}:{lineno} is not a JSON object", "write one object per line")
    return row


def read_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every row of a finished log as a dict (values as read)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"metric log {path} does not exist", "give the path of a .jsonl or .csv log"
        )
    fmt = detect_format(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    if fmt == "csv":
        delim = "\t" if path.suffix.lower() == ".tsv" else ","
        reader = csv.DictReader(io.StringIO(text), delimiter=delim)
        if not reader.fieldnames:
            raise DataError(f"{path} has no CSV header", "put the column names on the first line")
        yield from reader
        return
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        row = _jsonl_row(line, i, path, last=i == len(lines) and not text.endswith("\n"))
        if row is not None:
            yield row


def follow_rows(
    path: str | Path, poll_s: float = 0.2, idle_timeout_s: float | None = None
) -> Iterator[dict[str, Any]]:
    """Rows of a log being written, as complete lines arrive; stops after `idle_timeout_s`
    seconds without new data (never, when None)."""
    path = Path(path)
    last_data = time.monotonic()
    while not path.exists():
        if idle_timeout_s is not None and time.monotonic() - last_data > idle_timeout_s:
            raise DataError(f"metric log {path} did not appear", "start the run, or check the path")
        time.sleep(poll_s)
    fmt = detect_format(path) if path.stat().st_size else path.suffix.lower().lstrip(".")
    header: list[str] | None = None
    pending = ""
    lineno = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        while True:
            chunk = fh.read()
            if chunk:
                last_data = time.monotonic()
                pending += chunk
                *lines, pending = pending.split("\n")
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


def choose_metrics(keys: set[str], requested: list[str] | None) -> dict[str, MetricKind]:
    """The metrics to watch: `--metric NAME[=KIND]` or the known names present in the log."""
    if requested:
        out: dict[str, MetricKind] = {}
        for spec in requested:
            name, _, kind = spec.partition("=")
            if kind and kind not in ("loss", "grad_norm", "throughput"):
                raise DataError(
                    f"--metric {spec}: unknown kind {kind!r}",
                    "write --metric NAME or NAME=KIND with KIND one of loss, grad_norm, throughput",
                )
            if keys and name not in keys:
                raise DataError(
                    f"--metric {name}: the log has no numeric column {name!r}",
                    f"choose among: {', '.join(sorted(keys)) or '(no numeric columns)'}",
                )
            out[name] = kind or infer_kind(name)  # type: ignore[assignment]
        return out
    found = {k: v for k, v in KNOWN_METRICS.items() if k in keys}
    if not found:
        raise DataError(
            f"no known metric in the log (columns: {', '.join(sorted(keys)) or 'none'})",
            f"name them with --metric NAME[=loss|grad_norm|throughput]; known names: "
            f"{', '.join(KNOWN_METRICS)}",
        )
    return found
