"""`TensorBoardSink`: metric rows as TensorBoard scalars, findings as text events at their step.

The writer is torch's `torch.utils.tensorboard.SummaryWriter`: torch is already required, so
the only addition is the `tensorboard` package (the `tensorboard` extra), which also provides
the `EventAccumulator` that `watch` reads event files with. tensorboardX would be a second
package for the same files. A resumed run reopens the writer with `purge_step`, so TensorBoard
hides the steps the crash threw away instead of drawing them twice.
"""

from __future__ import annotations

import atexit
import importlib.util
from pathlib import Path
from typing import Any

from trainguard.errors import ConfigError
from trainguard.metrics.viewer_rows import StepTracker, finding_text, scalars_of


def require_tensorboard(what: str) -> None:
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            f"{what} needs the tensorboard package, which is not installed",
            "pip install 'trainguard[tensorboard]', or drop the TensorBoard setting",
        )


class TensorBoardSink:
    """Writes step/eval rows as scalars (`train/loss`, `eval/val_loss`, ...) and each finding
    as a text event `findings/<code>[/<metric>]` at its step. Flushes after every finding."""

    def __init__(self, log_dir: str | Path, flush_secs: int = 10) -> None:
        require_tensorboard(f"TensorBoard output to {log_dir}")
        self.log_dir = Path(log_dir)
        self.flush_secs = flush_secs
        self._writer: Any = None
        self._purge_step: int | None = None
        self._step = StepTracker()

    def _open(self) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(
                str(self.log_dir), purge_step=self._purge_step, flush_secs=self.flush_secs
            )
            self._purge_step = None
            atexit.register(self.close)  # a loop that never calls close still gets its tail
        return self._writer

    def write(self, row: dict[str, Any]) -> None:
        step = self._step(row)
        kind = row.get("kind")
        if kind == "finding":
            writer = self._open()
            # One tag per code and metric: R101 on the loss and on the grad norm at one step
            # are two texts, not one shown over the other.
            metric = f"/{row['metric']}" if row.get("metric") else ""
            writer.add_text(f"findings/{row.get('code')}{metric}", finding_text(row), step)
            writer.flush()
            return
        scalars = scalars_of(row)
        if scalars:
            writer = self._open()
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, step)

    def truncate_after(self, step: int) -> list[dict[str, Any]]:
        self.close()
        self._purge_step = step + 1  # events at steps > `step` are hidden when reopened
        return []

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            atexit.unregister(self.close)
