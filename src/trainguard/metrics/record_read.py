"""The one reader of a run record (`metrics/record.py` writes it): every tool that reads a run
dir (`report`, `batch`, `reference record`, `eval`, `watch`) gets its rows here.

    record = read_record(run_dir)        # BadInputError (exit 2) for what is not a run record
    record.steps()                       # step rows in log order, `step` 0-based
    record.last_by_step("step")          # {step: its last row} (a replayed step keeps its last)
    record.info                          # run.json ({} for the previous release's runs)

A run dir without run.json (or with a `schema_version` below 2) is the previous release's
`trainguard run`: its step and finding rows counted completed steps (1-based), and the rollback
events' `bad_positions` were keyed by them; they are converted here (step - 1), so that every
tool sees the 0-based index of the step computed, whoever wrote the record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import BadInputError
from trainguard.metrics.jsonl import METRICS_FILE, read_metrics
from trainguard.metrics.record import RUN_FILE, SCHEMA_VERSION
from trainguard.metrics.rowjson import RowRejected, parse_row
from trainguard.util.inputs import read_text

NOT_A_RUN = (
    "pass the folder a run record is in: the run_dir of Guard(run_dir=...), a GuardedTrainer's "
    "or Lightning callback's guard, or the run dir of `trainguard run`"
)
_CONVERTED_KINDS = ("step", "finding")  # rows whose `step` counted completed steps


@dataclass
class RunRecord:
    """A run record as read: run.json (`info`) and every usable metrics.jsonl row."""

    run_dir: Path
    info: dict[str, Any]
    rows: list[dict[str, Any]]
    skipped: list[str] = field(default_factory=list)

    @property
    def schema_version(self) -> int:
        v = self.info.get("schema_version")
        return v if isinstance(v, int) and not isinstance(v, bool) else 1

    @property
    def loop(self) -> str:
        return str(self.info.get("loop") or "trainguard run")

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("kind") == kind]

    def steps(self) -> list[dict[str, Any]]:
        """Step rows with an integer step, in log order (a rolled-back step appears again)."""
        return [r for r in self.kind("step") if _int(r.get("step")) is not None]

    def last_by_step(self, kind: str = "step") -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for r in self.kind(kind):
            s = _int(r.get("step"))
            if s is not None:
                out[s] = r
        return out

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.kind("event") if name is None or r.get("event") == name]

    @property
    def environment(self) -> dict[str, Any]:
        """run.json's environment, else the one `trainguard run`'s start event logged."""
        env = self.info.get("environment")
        if isinstance(env, dict) and env:
            return env
        start = next(iter(self.events("start")), None)
        env = (start or {}).get("env")
        return env if isinstance(env, dict) else {}

    @property
    def sampler(self) -> dict[str, Any] | None:
        s = self.info.get("sampler")
        return s if isinstance(s, dict) else None

    @property
    def checkpoints(self) -> dict[str, Any] | None:
        c = self.info.get("checkpoints")
        return c if isinstance(c, dict) and isinstance(c.get("root"), str) else None

    @property
    def config(self) -> Any:
        return self.info.get("config")


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def read_run_info(run_dir: Path) -> dict[str, Any]:
    """RUN_DIR/run.json as a dict; {} when there is none; BadInputError when it is damaged."""
    path = run_dir / RUN_FILE
    if not path.exists():
        return {}
    fix = f"restore {path} from a backup, or delete it to read the run as the previous release's"
    text = read_text(path, "run record", fix)
    try:
        info = parse_row(text.strip())  # bounded: a hostile run.json is refused, not a crash
    except RowRejected as e:
        raise BadInputError(f"{path} is not a run record: {e}", fix) from None
    if not isinstance(info.get("schema_version"), int) or isinstance(
        info.get("schema_version"), bool
    ):
        raise BadInputError(f"{path} has no integer schema_version: not a run record", fix)
    if info["schema_version"] > SCHEMA_VERSION:
        raise BadInputError(
            f"{path} has schema_version {info['schema_version']}; this trainguard reads up to "
            f"{SCHEMA_VERSION}",
            "upgrade trainguard (pip install -U trainguard)",
        )
    return info


def _to_zero_based(row: dict[str, Any]) -> dict[str, Any]:
    """A row of the previous release's `trainguard run` with the step it computed, 0-based."""
    if row.get("kind") in _CONVERTED_KINDS and (s := _int(row.get("step"))) is not None:
        row = {**row, "step": s - 1}
    elif row.get("kind") == "event" and isinstance(row.get("bad_positions"), dict):
        moved = {}
        for k, v in row["bad_positions"].items():
            moved[str(int(k) - 1) if str(k).lstrip("-").isdigit() else k] = v
        row = {**row, "bad_positions": moved}
    return row


def as_recorded(rows: list[dict[str, Any]], info: dict[str, Any]) -> list[dict[str, Any]]:
    """`rows` of a record whose run.json is `info`, with 0-based steps (converted when the
    record is the previous release's)."""
    if info.get("schema_version", 1) < 2:
        return [_to_zero_based(r) for r in rows]
    return rows


def is_run_record(path: Path) -> bool:
    """A folder holding a run record (metrics.jsonl or run.json)."""
    return path.is_dir() and ((path / METRICS_FILE).is_file() or (path / RUN_FILE).is_file())


def read_record(run_dir: str | Path, skipped: list[str] | None = None) -> RunRecord:
    """The run record in `run_dir` (see the module docstring). BadInputError (exit 2) for a
    missing folder, a file, a folder without a record, a damaged run.json. `skipped`, when
    given, receives the metrics.jsonl lines left out ("path:line: why")."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "does not exist" if not run_dir.exists() else "is a file, not a run dir"
        raise BadInputError(f"run dir {run_dir} {what}", NOT_A_RUN)
    if not is_run_record(run_dir):
        raise BadInputError(
            f"{run_dir} is not a run dir: it has no {METRICS_FILE} and no {RUN_FILE} (no run "
            "record)",
            NOT_A_RUN,
        )
    info = read_run_info(run_dir)
    lost: list[str] = []
    rows = as_recorded(read_metrics(run_dir, lost), info)
    if skipped is not None:
        skipped.extend(lost)
    return RunRecord(run_dir, info, rows, lost)
