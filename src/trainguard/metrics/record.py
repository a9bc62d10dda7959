"""The run record every loop writes: `RUN_DIR/run.json` and the rows of `RUN_DIR/metrics.jsonl`.

One schema for `Guard(run_dir=...)` in your own loop, `GuardedTrainer`, the Lightning callback
and `trainguard run` (docs/run-record.md), read back by one function
(`metrics.record_read.read_record`) in every tool (`report`, `batch`, `reference record`,
`eval`, `watch`):

- `run.json` (written whole, atomically, when the record starts and again when something is
  attached): `schema_version` (2), `format`, `loop` (who wrote it), `environment` (library
  versions and the settings that change numbers, `metrics.environment`), `config` (the user's
  config: any dict, dataclass or pydantic model, made JSON-safe), `sampler` (the
  `ElasticSampler`'s identity: its state_dict without the skips, which the rollback events
  carry), `checkpoints` (where they are and how their folders are named).
- `metrics.jsonl`, append-only and flushed per row (a SIGKILL loses at most the last line,
  which every reader ignores when it is torn): step rows `{"kind": "step", "step" (0-based:
  the index of the step computed), "loss", "grad_norm" (before clipping), "lr", "tokens",
  "data_time_s", "step_time_s", "position", "batch_hash", "action", "time", ...}`, finding
  rows `{"kind": "finding", **Finding}`, event rows (`rollback`, ...).

Writing a row reads nothing from the device: the values are those the guard already read in
its one host sync per step; the learning rate is read only when it is a Python number.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainguard.metrics.jsonl import MetricsLog, json_safe
from trainguard.util.atomic import atomic_write_text
from trainguard.util.paths import is_remote, local_path

SCHEMA_VERSION = 2
RUN_FILE = "run.json"
FORMAT = "trainguard-run-record"
_MAX_DEPTH = 16  # a user's config nests a few levels; deeper is cut, not a recursion error


def json_ready(value: Any, depth: int = 0) -> Any:
    """`value` as JSON-safe data: dataclasses, pydantic models and objects with `to_dict`
    (a Hugging Face `TrainingArguments`) as dicts, paths as text, non-finite floats as text,
    anything else as its `str`."""
    if depth > _MAX_DEPTH:
        return "..."
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)  # TrainingArguments: enums made plain
        raw = to_dict() if callable(to_dict) else dataclasses.asdict(value)
        return json_ready(raw, depth + 1)
    dump = getattr(value, "model_dump", None)  # pydantic (a recipe)
    if callable(dump) and not isinstance(value, type):
        return json_ready(dump(mode="json"), depth + 1)
    if isinstance(value, Mapping):
        return {str(k): json_ready(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [json_ready(v, depth + 1) for v in items]
    return str(value)


def sampler_identity(sampler: Any) -> dict[str, Any] | None:
    """The order an `ElasticSampler` reads (seed, num_samples, batch size or schedule, state
    version): its `state_dict` without the skips, which change with rollbacks and are in the
    rollback events. None for another sampler (then `batch` cannot list a step's samples)."""
    state = getattr(sampler, "state_dict", None)
    if sampler is None or not callable(state) or not hasattr(sampler, "batch_hash"):
        return None
    ident = {k: v for k, v in state().items() if k != "skipped_positions"}
    return json_ready(ident)


def write_run_info(
    run_dir: str | Path,
    *,
    loop: str,
    config: Any = None,
    sampler: Any = None,
    checkpoints: Mapping[str, Any] | None = None,
    environment: Mapping[str, Any] | None = None,
    schema_version: int = SCHEMA_VERSION,
) -> Path:
    """Write RUN_DIR/run.json (whole, atomically; a link there is refused). `sampler`: the
    `ElasticSampler` itself or its identity dict; `checkpoints`: `{"root": path, "layout":
    "checkpointer" | "hf" | "lightning"}`; `environment`: default this process's."""
    from trainguard.metrics.environment import environment_fingerprint

    ident = sampler if isinstance(sampler, Mapping) or sampler is None else None
    if checkpoints is not None and not is_remote(checkpoints.get("root", "")):
        checkpoints = {**checkpoints, "root": _root_as_recorded(run_dir, checkpoints["root"])}
    info = {
        "schema_version": schema_version,
        "format": FORMAT,
        "loop": loop,
        "written_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": json_ready(environment or environment_fingerprint()),
        "config": json_ready(config),
        "sampler": json_ready(ident) if ident is not None else sampler_identity(sampler),
        "checkpoints": json_ready(checkpoints),
    }
    path = Path(run_dir) / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(info, indent=1) + "\n")
    return path


def _root_as_recorded(run_dir: str | Path, root: str | Path) -> str:
    """A local checkpoint root inside the run dir relative to it (the record stays true when
    the run dir is copied or moved), any other absolute (a relative one was relative to the
    loop's working folder, not to the run dir)."""
    path = local_path(root).absolute()
    try:
        return str(path.relative_to(Path(run_dir).absolute()))
    except ValueError:
        return str(path)


def global_rank() -> int:
    """This process's rank in the job: torch.distributed's once initialised, else torchrun's
    `RANK`, else 0."""
    import sys

    dist = sys.modules.get("torch.distributed")  # never imported for this question
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    rank = os.environ.get("RANK", "0")
    return int(rank) if rank.isdigit() else 0


class RecordWriter:
    """The run record of a loop that is not `trainguard run` (the Guard writes through it, its
    rows by way of `goodput.loop_timing.LoopTiming`, which adds goodput's timing rows).

    Global rank 0 writes it; on every other rank it takes the attachments and writes nothing
    (`writes`): a run dir has one writer, and the ranks' guards take the same decisions. So
    `Guard(run_dir=D)` may be built with the same D on every rank.

    `attach(...)` names what the record cannot see by itself (the sampler, the optimizer, the
    user's config, the checkpoint location, the tokens per sample) and rewrites run.json; a
    record nobody attached anything to still gets run.json (with the environment) before its
    first row."""

    def __init__(self, run_dir: str | Path, loop: str = "own loop") -> None:
        self.run_dir = Path(run_dir)
        self.log = MetricsLog(self.run_dir)  # refuses a linked metrics.jsonl now
        self.loop = loop
        self.sampler: Any = None
        self.optimizer: Any = None
        self.config: Any = None
        self.checkpoints: dict[str, Any] | None = None
        self.tokens_per_sample: int | None = None
        self._described = False
        self._last_row_at: float | None = None  # the step time where the loop gives none

    @property
    def writes(self) -> bool:
        """Whether this process writes the record (global rank 0), asked at each write: a
        framework may set up the process group after the guard was built (Lightning)."""
        return global_rank() == 0

    def attach(
        self,
        *,
        sampler: Any = None,
        optimizer: Any = None,
        config: Any = None,
        checkpoints: str | Path | Mapping[str, Any] | None = None,
        tokens_per_sample: int | None = None,
        loop: str | None = None,
    ) -> None:
        """Name the loop's parts for the record; what is None stays as attached before.
        `checkpoints`: a `Checkpointer`'s root (path), or `{"root", "layout"}`."""
        self.sampler = sampler if sampler is not None else self.sampler
        self.optimizer = optimizer if optimizer is not None else self.optimizer
        self.config = config if config is not None else self.config
        if tokens_per_sample is not None:
            self.tokens_per_sample = int(tokens_per_sample)
        if loop is not None:
            self.loop = loop
        if checkpoints is not None:
            if isinstance(checkpoints, Mapping):
                self.checkpoints = dict(checkpoints)
            else:
                self.checkpoints = {"root": str(checkpoints), "layout": "checkpointer"}
        self.describe()

    def describe(self) -> None:
        """(Re)write run.json from what is attached (global rank 0)."""
        if not self.writes:
            return
        write_run_info(
            self.run_dir,
            loop=self.loop,
            config=self.config,
            sampler=self.sampler,
            checkpoints=self.checkpoints,
        )
        self._described = True

    def step_row(
        self,
        step: int,
        values: Mapping[str, Any],
        action: str,
        router_stats: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The step row of `step` from the values the guard read (no device read here).
        `router_stats`: the MoE layers' counts the guard judged (host numbers by then), kept
        so that `trainguard watch` replays R601-R604 from the record."""
        row: dict[str, Any] = {"kind": "step", "step": step}
        row |= {k: v for k, v in values.items() if v is not None}
        if router_stats:
            row["router"] = router_counts(router_stats)
        lr = _learning_rate(self.optimizer)
        if lr is not None and "lr" not in row:
            row["lr"] = lr
        s = self.sampler
        if s is not None and hasattr(s, "batch_hash"):
            row["position"] = int(s.position(step))  # the batch of this row: `batch --step`
            row["batch_hash"] = s.batch_hash(step)
            if self.tokens_per_sample is not None and "tokens" not in row:
                row["tokens"] = int(s.global_batch_size_at(step)) * self.tokens_per_sample
        now = time.perf_counter()
        if "step_time_s" not in row and self._last_row_at is not None:
            # The time since the previous step's row (the Trainer and Lightning time no data
            # phase, so the guard has no step time of its own for them).
            row["step_time_s"] = now - self._last_row_at
        self._last_row_at = now
        row["time"] = time.time()
        row["action"] = action
        return row

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row (finding, event) to metrics.jsonl; run.json first if not yet."""
        if not self.writes:
            return
        if not self._described:
            self.describe()
        self.log.write({k: json_safe(v) for k, v in row.items()})

    def close(self) -> None:
        self.log.close()


def router_counts(stats: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The MoE router statistics protocol's counts per layer as plain ints (the MoE detector
    reads the same ints: no read of its own)."""
    out: dict[str, dict[str, Any]] = {}
    for name, s in stats.items():
        layer: dict[str, Any] = {
            "tokens_routed": int(s.get("tokens_routed", 0)),
            "tokens_dropped": int(s.get("tokens_dropped", 0)),
            "expert_counts": [int(c) for c in s.get("expert_counts", [])],
        }
        if s.get("top_k") is not None:
            layer["top_k"] = int(s["top_k"])
        out[str(name)] = layer
    return out


def _learning_rate(optimizer: Any) -> float | None:
    """The first parameter group's learning rate when it is a Python number (a tensor lr is
    not read: that would be a host sync the guard does not take)."""
    groups = getattr(optimizer, "param_groups", None)
    if not groups:
        return None
    lr = groups[0].get("lr") if isinstance(groups[0], Mapping) else None
    return float(lr) if isinstance(lr, int | float) and not isinstance(lr, bool) else None
