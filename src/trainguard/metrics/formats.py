"""Which metric logs `trainguard watch` reads, how each is recognised, and its rows.

- JSON Lines and CSV/TSV with a header (any trainer; `logfile`), followed live with `--follow`;
- a TensorBoard event file, or a folder holding one run's event files (`tensorboard_read`);
- a Hugging Face `trainer_state.json` (its `log_history`), or the checkpoint folder holding it;
- a run dir holding a run record (`metrics/record.py`: any loop's metrics.jsonl and run.json),
  read with 0-based steps (`metrics.record_read`);
- a W&B UI "Export CSV": a first column for the x axis (`Step`) and one `<run> - <metric>`
  column per run, with `<run> - <metric>__MIN` / `__MAX` companions (ignored).

Every reader yields plain dict rows with a `step` key and the metric names the trainer used
(`train/loss`, `loss`, `grad_norm`, ...), which
`guard.detectors.metric_names.KNOWN_METRICS` maps to the detectors.
Anything else is a `DataError` (exit 2) naming the accepted formats.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.errors import DataError
from trainguard.metrics.accepted import ACCEPTED, EVENT_GLOB
from trainguard.metrics.jsonl import METRICS_FILE
from trainguard.metrics.logfile import csv_rows, follow_lines, jsonl_rows
from trainguard.metrics.record_read import as_recorded, is_run_record, read_run_info
from trainguard.util.inputs import read_text, require_file

FIX = f"give one of: {ACCEPTED}"
HF_STATE = "trainer_state.json"
# "<run> - <metric>" columns of a W&B chart export; the run name is the text before the first
# " - " (W&B run names have no spaces unless renamed).
_WANDB_COLUMN = re.compile(r"^(?P<run>.+?) - (?P<metric>.+)$")
_WANDB_COMPANIONS = ("__MIN", "__MAX")


def _unknown(path: Path, why: str) -> DataError:
    return DataError(f"{path} is not a metric log trainguard reads ({why})", FIX)


def _head_text(path: Path, size: int = 65536) -> str:
    with open(path, "rb") as fh:
        head = fh.read(size)
    if b"\0" in head:
        raise _unknown(path, "binary content")
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as e:
        if len(head) < size or e.start < len(head) - 4:  # not a character cut by the read size
            raise _unknown(path, "not UTF-8 text") from None
        return head[: e.start].decode("utf-8")


def detect_format(path: Path) -> str:
    """One of run_record, jsonl, csv, tensorboard, hf_trainer_state, wandb_csv; a DataError
    otherwise."""
    if path.is_dir():
        if is_run_record(path):  # any loop's run record: metrics.jsonl beside run.json
            return "run_record"
        if (path / HF_STATE).is_file():
            return "hf_trainer_state"
        if any(p.is_file() for p in path.rglob(EVENT_GLOB)):
            return "tensorboard"
        raise _unknown(path, f"a folder with no TensorBoard event files and no {HF_STATE}")
    # A device (/dev/zero), pipe or socket is named as what it is, and never read (no hang).
    require_file(path, "metric log", FIX, DataError)
    if path.name.startswith("events.out.tfevents"):
        return "tensorboard"
    suffix = path.suffix.lower()
    head = _head_text(path)
    stripped = head.lstrip()
    if path.name == HF_STATE or (suffix == ".json" and _is_trainer_state(path)):
        return "hf_trainer_state"  # by name: one without log_history gets the reader's error
    if suffix in (".jsonl", ".ndjson") or stripped.startswith("{"):
        return "jsonl"
    if not stripped:
        raise _unknown(path, "the file is empty")
    header = stripped.splitlines()[0].split("\t" if suffix == ".tsv" else ",")
    cells = [c.strip().strip('"') for c in header]
    is_wandb = any(_WANDB_COLUMN.match(c) for c in cells[1:])
    if len(cells) > 1 and not _WANDB_COLUMN.match(cells[0]) and is_wandb:
        return "wandb_csv"
    return "csv"


def _is_trainer_state(path: Path) -> bool:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(doc, dict) and "log_history" in doc


def read_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every row of a finished log, whatever its format (values as read)."""
    path = Path(path)
    fmt = detect_format(path)
    if fmt == "tensorboard":
        from trainguard.metrics.tensorboard_read import tensorboard_rows

        yield from tensorboard_rows(path)
        return
    if fmt == "hf_trainer_state":
        yield from trainer_state_rows(path / HF_STATE if path.is_dir() else path)
        return
    if fmt == "run_record":  # its metrics.jsonl, steps 0-based whoever wrote it
        log = path / METRICS_FILE
        text = read_text(log, "metric log", FIX, DataError)
        yield from as_recorded(list(jsonl_rows(log, text)), read_run_info(path))
        return
    text = read_text(path, "metric log", FIX, DataError)  # strict: no silent U+FFFD values
    if fmt == "wandb_csv":
        yield from wandb_csv_rows(path, text)
    elif fmt == "csv":
        yield from csv_rows(path, text)
    else:
        yield from jsonl_rows(path, text)


def follow_rows(
    path: str | Path, poll_s: float = 0.2, idle_timeout_s: float | None = None
) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL or CSV log being written, as complete lines arrive; stops after
    `idle_timeout_s` seconds without new data (never, when None)."""
    path = Path(path)
    start = time.monotonic()
    while not path.exists():
        if idle_timeout_s is not None and time.monotonic() - start > idle_timeout_s:
            raise DataError(f"metric log {path} did not appear", "start the run, or check the path")
        time.sleep(poll_s)
    if path.is_file() and not path.stat().st_size:
        fmt = "csv" if path.suffix.lower() in (".csv", ".tsv") else "jsonl"
    else:
        fmt = detect_format(path)
    if fmt not in ("jsonl", "csv"):
        raise DataError(
            f"--follow tails a JSON Lines or CSV log; {path} is {fmt.replace('_', ' ')}",
            "drop --follow: that format is read whole",
        )
    yield from follow_lines(path, fmt, poll_s, idle_timeout_s)


def trainer_state_rows(path: Path) -> Iterator[dict[str, Any]]:
    """`log_history` of a Hugging Face `trainer_state.json`, one row per step.

    The Trainer logs training and evaluation entries separately at the same step; they are
    merged. The end-of-training summary entry (`train_runtime`, `train_loss` averaged over the
    whole run) describes no step and is left out.
    """
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON ({e})", FIX) from None
    except RecursionError:  # nesting deeper than the parser's stack: not a trainer's state
        raise DataError(
            f"{path} nests its values too deep to be a trainer_state.json", FIX
        ) from None
    history = doc.get("log_history") if isinstance(doc, dict) else None
    if not isinstance(history, list):
        raise DataError(f"{path} has no log_history list: not a trainer_state.json", FIX)
    merged: dict[int, dict[str, Any]] = {}
    for entry in history:
        if not isinstance(entry, dict) or "train_runtime" in entry:
            continue
        step = entry.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            merged.setdefault(step, {}).update(entry)
    for step in sorted(merged):
        yield {**merged[step], "step": step}


def wandb_csv_rows(path: Path, text: str) -> Iterator[dict[str, Any]]:
    """A W&B chart's Export CSV: the first column is the x axis (`Step`); each run's metric is
    `<run> - <metric>`. With one run the names become the bare metric (`train/loss`); with
    several they stay `<run> - <metric>` so that each run is watched on its own (`--metric`)."""
    rows = csv_rows(path, text)
    first = next(rows, None)
    if first is None:
        return
    columns = list(first)
    x_axis = columns[0]
    metrics = {}
    for c in columns[1:]:
        m = _WANDB_COLUMN.match(c)
        if c.endswith(_WANDB_COMPANIONS) or (m and m.group("metric").startswith("_")):
            continue  # min/max of a sampled bucket; W&B's own _step/_runtime/_timestamp
        metrics[c] = m
    runs = {m.group("run") for m in metrics.values() if m}
    names = {c: m.group("metric") if m and len(runs) == 1 else c for c, m in metrics.items()}
    for row in (first, *rows):
        yield {"step": row.get(x_axis), **{names[c]: row.get(c) for c in metrics}}
