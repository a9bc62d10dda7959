"""Where metric rows go: the `MetricsSink` protocol and the fan-out `run` and `Guard` share.

A row is what `metrics.jsonl` holds (see `metrics.jsonl`): `{"kind": "step", "step", "loss",
...}`, `{"kind": "eval", ...}`, `{"kind": "evals", ...}`, `{"kind": "finding", **Finding}`,
`{"kind": "event", ...}`, `{"kind": "meta", ...}`. Every sink takes the same rows and shows what
it can: the JSONL record keeps everything; TensorBoard and W&B plot the numbers and show each
finding as text at its step.

    fanout = open_run_sinks(run_dir, recipe.metrics)   # metrics.jsonl + the configured viewers
    fanout.write({"kind": "step", "step": 7, "loss": 2.31, "grad_norm": 0.9})
    fanout.truncate_after(4)                            # resume: steps after 4 are recomputed
    fanout.close()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trainguard.metrics.config import MetricsConfig
from trainguard.metrics.jsonl import MetricsLog


@runtime_checkable
class MetricsSink(Protocol):
    """Anything that takes metric rows: `MetricsLog`, `TensorBoardSink`, `WandbSink`, yours."""

    def write(self, row: dict[str, Any]) -> None:
        """Take one row; a sink ignores kinds it cannot show."""

    def truncate_after(self, step: int) -> list[dict[str, Any]]:
        """A resume from `step`: rows of later steps will be written again. Returns the rows
        the sink dropped (the JSONL record's; viewers return [])."""

    def close(self) -> None:
        """Flush and release; a later `write` may reopen."""


class MetricsFanout:
    """Sends every row to the JSONL record (when there is one) and then to each viewer.

    Viewers open lazily on their first row, so processes that never write (ranks other than
    0) never create TensorBoard files or W&B runs.
    """

    def __init__(self, record: MetricsLog | None = None, viewers: list[MetricsSink] | None = None):
        self.record = record
        self.viewers: list[MetricsSink] = list(viewers or [])

    @property
    def path(self) -> Path:
        """The JSONL record's path (the run's metrics.jsonl)."""
        if self.record is None:
            raise AttributeError("this fan-out has no JSONL record")
        return self.record.path

    @property
    def sinks(self) -> list[MetricsSink]:
        return ([self.record] if self.record is not None else []) + self.viewers

    def write(self, row: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(row)

    def truncate_after(self, step: int) -> list[dict[str, Any]]:
        dropped = self.record.truncate_after(step) if self.record is not None else []
        for viewer in self.viewers:
            viewer.truncate_after(step)
        return dropped

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def resolve_dir(run_dir: Path | None, folder: str | Path) -> Path:
    """A configured folder: relative ones are inside the run dir (when there is one)."""
    folder = Path(folder).expanduser()
    if folder.is_absolute() or run_dir is None:
        return folder
    return Path(run_dir) / folder


def viewers_for(run_dir: Path | None, config: MetricsConfig) -> list[MetricsSink]:
    """The viewers a `metrics` section asks for; a missing optional package is a ConfigError
    (exit 2) now, before any training, not a surprise at the first row."""
    viewers: list[MetricsSink] = []
    if config.tb_dir:
        from trainguard.metrics.tensorboard_sink import TensorBoardSink

        viewers.append(TensorBoardSink(resolve_dir(run_dir, config.tb_dir)))
    if config.wandb:
        from trainguard.metrics.wandb_sink import WandbSink

        viewers.append(
            WandbSink(
                run_dir if run_dir is not None else Path.cwd(),
                project=config.wandb_project,
                mode=config.wandb_mode,
            )
        )
    return viewers


def open_run_sinks(run_dir: Path, config: MetricsConfig | None = None) -> MetricsFanout:
    """`run`'s metrics: RUN_DIR/metrics.jsonl plus the viewers of the recipe's `metrics`."""
    return MetricsFanout(MetricsLog(run_dir), viewers_for(run_dir, config or MetricsConfig()))
