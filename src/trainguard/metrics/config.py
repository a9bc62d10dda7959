"""The recipe's `metrics` section: where a run's metrics and findings go besides metrics.jsonl.
Kept free of torch and of the optional writers so that loading a recipe imports neither."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict

from trainguard.util.strict import StrictModel


class MetricsConfig(StrictModel):
    """The recipe's `metrics` section. `metrics.jsonl` is always written; these add viewers."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    tb_dir: str | None = None
    """TensorBoard log folder for the step metrics, evaluations and findings (text events at
    their step). A relative path is inside the run dir (`tb` -> `RUN_DIR/tb`). Needs the
    `tensorboard` extra. Default: no TensorBoard output."""
    wandb: bool = False
    """Also log to Weights & Biases (needs the `wandb` extra): step metrics and evaluations
    against the `trainguard/step` axis, findings as text at their step and as a table at the
    end. Each launch of `trainguard run` (a resume too) is its own W&B run."""
    wandb_project: str = "trainguard"
    """W&B project name."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """`offline` writes the W&B run under `RUN_DIR/wandb` and sends nothing (upload later with
    `wandb sync`); `online` streams to the W&B server you are logged in to."""
