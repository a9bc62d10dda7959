"""Hugging Face `Trainer` adapter: `Trainer(..., callbacks=[TrainguardCallback()])`.

Before each optimizer step the gradient norm is computed from the model and scored; a skip
clears the gradients so the Trainer's optimizer step changes nothing. Logged losses (every
`logging_steps`) feed the loss detectors. A rollback or halt stops training
(`control.should_training_stop`); resume from the last checkpoint with `resume_from_checkpoint`.
"""

from __future__ import annotations

from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "trainguard.integrations.hf needs Hugging Face transformers: pip install transformers"
    ) from e

from trainguard.guard import Decision, Guard
from trainguard.integrations import clear_grads


class TrainguardCallback(TrainerCallback):
    def __init__(self, guard: Guard | None = None, run_dir: str | None = None) -> None:
        self.guard = guard or Guard(run_dir=run_dir)
        self.decisions: list[Decision] = []

    def _act(self, d: Decision, control: Any, model: Any = None) -> None:
        if d.findings:
            self.decisions.append(d)
        if d.action != "apply" and model is not None:
            clear_grads(model)
        if d.action in ("rollback", "halt"):
            control.should_training_stop = True

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        d = self.guard.step(state.global_step, model=model)  # grad norm from the gradients
        self._act(d, control, model)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" in logs:
            d = self.guard.step(state.global_step, loss=logs["loss"])
            self._act(d, control)
        return control
