"""Lightning adapter: `Trainer(callbacks=[TrainguardLightningCallback()])`.

`on_before_optimizer_step` scores the gradient norm before the update and clears the gradients
of a step that must be skipped; `on_train_batch_end` feeds the step's loss. A rollback or halt
sets `trainer.should_stop`; resume from the last checkpoint (`ckpt_path="last"`).
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - depends on the environment
    try:
        from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]
    except ImportError as e:
        raise ImportError(
            "trainguard.integrations.lightning needs Lightning: pip install lightning"
        ) from e

from trainguard.guard import Decision, Guard
from trainguard.integrations import clear_grads


class TrainguardLightningCallback(Callback):
    def __init__(self, guard: Guard | None = None, run_dir: str | None = None) -> None:
        self.guard = guard or Guard(run_dir=run_dir)
        self.decisions: list[Decision] = []

    def _act(self, d: Decision, trainer: Any, module: Any = None) -> None:
        if d.findings:
            self.decisions.append(d)
        if d.action != "apply" and module is not None:
            clear_grads(module)
        if d.action in ("rollback", "halt"):
            trainer.should_stop = True

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._act(self.guard.step(trainer.global_step, model=pl_module), trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._act(self.guard.step(trainer.global_step, loss=loss), trainer)
