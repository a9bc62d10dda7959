"""What a viewer (TensorBoard, W&B) shows of a metric row: its plottable numbers under a tag
prefix, a finding as one line of text, and the step a row belongs to. Shared by the viewer
sinks (`tensorboard_sink.py`, `wandb_sink.py`); `sinks.py` opens them."""

from __future__ import annotations

from typing import Any

# What a viewer plots of each row kind, under which tag prefix (`train/loss`, `eval/val_loss`).
_PREFIX = {"step": "train", "eval": "eval", "evals": "evals"}
# Bookkeeping columns, not metrics: the step itself, wall-clock time, token counts of evals.
_NOT_METRICS = frozenset({"kind", "step", "time", "tokens"})


def scalars_of(row: dict[str, Any]) -> dict[str, float]:
    """The plottable numbers of a step/eval/evals row as {"train/loss": 2.3, ...}; NaN and
    inf are kept (a viewer should show them, not hide them)."""
    prefix = _PREFIX.get(row.get("kind", ""))
    if prefix is None:
        return {}
    return {
        f"{prefix}/{k}": float(v)
        for k, v in row.items()
        if k not in _NOT_METRICS and isinstance(v, int | float) and not isinstance(v, bool)
    }


def finding_text(row: dict[str, Any]) -> str:
    """A finding row as one line of Markdown: `**R101** error (loss): message. Fix: ...`."""
    metric = f" ({row['metric']})" if row.get("metric") else ""
    fix = f" Fix: {row['fix']}" if row.get("fix") else ""
    return f"**{row.get('code')}** {row.get('severity')}{metric}: {row.get('message')}.{fix}"


class StepTracker:
    """The step a row belongs to: its own, else the last one seen (pre-flight findings and
    events carry none)."""

    def __init__(self) -> None:
        self.last = 0

    def __call__(self, row: dict[str, Any]) -> int:
        step = row.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            self.last = step
        return self.last
