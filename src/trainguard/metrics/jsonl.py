"""The run's own metric log, `RUN_DIR/metrics.jsonl`: one JSON object per line.

Step rows have `"kind": "step"`; evaluation rows `"kind": "eval"` (and `"evals"` for use-case
evals); findings `"kind": "finding"`; run events (start, resume, end) `"kind": "event"`; the
data period `"kind": "meta"`.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any, TextIO

from trainguard.metrics.rowjson import RowRejected, iter_rows, parse_row
from trainguard.util.atomic import atomic_write_text
from trainguard.util.inputs import read_text
from trainguard.util.nofollow import open_append, refuse_link

METRICS_FILE = "metrics.jsonl"


def json_safe(v: Any) -> Any:
    # JSON has no NaN/Inf; keep them readable and parseable by every JSON reader.
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class MetricsLog:
    """Append-only JSONL writer, flushed per row so a killed run loses at most one line.

    The file is opened without following a link (`util/nofollow.py`): a symlinked (or FIFO)
    metrics.jsonl or guard.jsonl is refused when the log is made and again when it is opened
    (LinkRefused, exit 1), its target never written.

    A `MetricsSink` (see `metrics.sinks`): `run` uses it as the record every viewer is fed
    beside; `Guard` keeps its findings in `guard.jsonl` through it.
    """

    def __init__(self, run_dir: Path, filename: str = METRICS_FILE) -> None:
        self.path = Path(run_dir) / filename
        refuse_link(self.path)  # at once, not at the first row: the error names the cause
        self._file: TextIO | None = None

    def truncate_after(self, step: int) -> list[dict[str, Any]]:
        """A resume from `step` completed steps: drop the rows of the work a crash threw away
        (step and finding rows of step index `step` on, which count steps from 0, and later
        rows of any kind); returns the dropped rows.

        A resumed run recomputes those steps, so keeping them would log them twice; the
        dropped step rows' batch hashes let the resumed run prove it replays the same data.
        """
        self.close()  # the file is replaced below; an open handle would write to the old one
        refuse_link(self.path)  # its target is neither read nor replaced
        if not self.path.exists():
            return []
        kept, dropped = [], []
        lines = self.path.read_text(encoding="utf-8").split("\n")
        torn = lines.pop()  # "" after a final newline; else a write cut by SIGKILL
        for line in lines:
            try:
                row = parse_row(line)
            except RowRejected:
                # No reader can use it, but it is the log's: kept as it is, never dropped.
                if line.strip():
                    kept.append(line)
                continue
            if lost_on_resume(row, step):
                dropped.append(row)
            else:
                kept.append(line)
        with contextlib.suppress(RowRejected):  # a whole last row that lacks only its newline
            row = parse_row(torn)
            if not lost_on_resume(row, step):
                kept.append(torn)
        atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))
        return dropped

    def write(self, row: dict[str, Any]) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open_append(self.path)
        line = json.dumps({k: json_safe(v) for k, v in row.items()}, default=str)
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(run_dir: Path, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Every row of RUN_DIR/metrics.jsonl (`metrics.rowjson.parse_row`: bounded, objects only).

    A line no reader can use (damaged, not an object, nested too deep) is left out, and so is
    a last line cut by a crash; `skipped`, when given, receives "metrics.jsonl:LINE: why" for
    each left-out line but the cut last one, for the command to warn about.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    text = read_text(path, "metric log", "restore it from a backup, or start a new run dir")
    for lineno, row, why in iter_rows(text):
        if row is not None:
            rows.append(row)
        elif skipped is not None:
            skipped.append(f"{path}:{lineno}: {why}; the line is ignored")
    return rows


def lost_on_resume(row: dict[str, Any], completed: int) -> bool:
    """Whether a resume from `completed` steps recomputes what `row` records."""
    step = row.get("step")
    if not isinstance(step, int):
        return False
    # A step's own rows (its row, the detectors' findings) carry its 0-based index;
    # evaluations, events and checkpoint findings (C codes: a damaged step passed over, the
    # resume) the number of completed steps, i.e. the checkpoint, they speak of.
    kind = row.get("kind")
    checkpoint = kind == "finding" and str(row.get("code", "")).startswith("C")
    own = kind == "step" or (kind == "finding" and not checkpoint)
    return step > completed or (step == completed and own)
