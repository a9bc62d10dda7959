"""`WandbSink`: metric rows to Weights & Biases (offline by default), findings as text.

Written against wandb's documented API: `wandb.init(project=, dir=, name=, mode=)`,
`run.define_metric(name, step_metric=)`, `run.log(dict)`, `wandb.Table`, `run.finish()`.
Every value is logged against a custom x axis `trainguard/step` rather than W&B's own `_step`,
which must only grow: a rollback or a resume writes a step again, which W&B would drop.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from trainguard.errors import ConfigError
from trainguard.metrics.viewer_rows import StepTracker, finding_text, scalars_of

STEP_AXIS = "trainguard/step"
FINDING_COLUMNS = ["step", "code", "severity", "metric", "message", "fix"]


class WandbSink:
    """One W&B run per process lifetime, opened at the first row under `dir/wandb`.

    Scalars as `train/...`, `eval/...`; each finding as the text value `findings/<code>` at its
    step, and all findings as the table `findings` when the sink closes.
    """

    def __init__(
        self,
        dir: str | Path,
        project: str = "trainguard",
        mode: str = "offline",
        name: str | None = None,
    ) -> None:
        if importlib.util.find_spec("wandb") is None:
            raise ConfigError(
                "metrics.wandb is on but the wandb package is not installed",
                "pip install 'trainguard[wandb]', or set metrics.wandb=false",
            )
        self.dir = Path(dir)
        self.project = project
        self.mode = mode
        self.name = name or self.dir.resolve().name
        self._run: Any = None
        self._findings: list[list[Any]] = []
        self._step = StepTracker()

    def _open(self) -> Any:
        if self._run is None:
            import wandb

            self.dir.mkdir(parents=True, exist_ok=True)
            self._run = wandb.init(
                project=self.project,
                dir=str(self.dir),
                name=self.name,
                mode=self.mode,
                reinit="create_new",  # a Guard and a run in one process each get their own
            )
            self._run.define_metric(STEP_AXIS)
            self._run.define_metric("*", step_metric=STEP_AXIS)
        return self._run

    def write(self, row: dict[str, Any]) -> None:
        step = self._step(row)
        if row.get("kind") == "finding":
            self._findings.append([step, *(str(row.get(c) or "") for c in FINDING_COLUMNS[1:])])
            self._open().log({STEP_AXIS: step, f"findings/{row.get('code')}": finding_text(row)})
            return
        scalars = scalars_of(row)
        if scalars:
            self._open().log({STEP_AXIS: step, **scalars})

    def truncate_after(self, step: int) -> list[dict[str, Any]]:
        return []  # the custom step axis takes the recomputed steps as they come

    def close(self) -> None:
        if self._run is None:
            return
        import wandb

        if self._findings:
            table = wandb.Table(columns=FINDING_COLUMNS, data=self._findings)
            self._run.log({STEP_AXIS: self._step.last, "findings": table})
        self._run.finish()
        self._run = None
        self._findings = []
