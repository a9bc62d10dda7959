"""`GuardedTrainer`'s `train_loss` without the updates the guard skipped.

The Trainer (transformers 5.x, `_inner_training_loop`) adds each step's loss to an on-device sum
`_tr_loss` (a NaN or Inf one, with `logging_nan_inf_filter`, as a value it makes up), moves it to
`_total_loss_scalar` at each log, and at the end reports `train_loss` = everything added /
the steps trained: a 1000x spike the guard skipped, or the stand-in for a NaN, is averaged in.
`SkippedLoss` measures what the Trainer added for each step (the sum's change between two
`_maybe_log_save_evaluate` calls: device arithmetic, no host sync), keeps it for the steps the
guard skipped (read from `guard.history` once the decision is known: at once on the host path,
a step later on the device path) and takes it out of `train_loss` at the end (one host read).

The summary log entry then holds `train_loss` (applied updates only), `train_loss_with_skipped`
(the Trainer's own) and `train_loss_skipped_updates`; `trainer.skipped_updates` says the same.
The per-interval `loss` entries stay the Trainer's: they show what each step measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainguard.report.skips import HF_EXCLUDES, skipped_updates


class SkippedLoss:
    """What the Trainer's loss sum holds of the skipped steps of one `train()` call; `history_from`
    is where that call's actions start in `guard.history`."""

    def __init__(self, history_from: int = 0) -> None:
        self.history_from = history_from
        self._mark: Any = None  # the Trainer's `_tr_loss` after the last step (and log)
        self._last: int | None = None  # the last step measured
        self._added: dict[int, Any] = {}  # step -> what the Trainer added; decision to come
        self._skipped: Any = None  # on-device sum of the skipped steps' additions
        self.steps: list[int] = []

    def after_step(self, step: int, tr_loss: Any, guard: Any) -> None:
        """The Trainer's sum after step `step` (before a log resets it)."""
        if step != self._last:  # an epoch's end calls again after its last step
            self._last = step
            added = tr_loss.detach() - self._mark if self._mark is not None else tr_loss.detach()
            self._added[step] = added.clone()
        self._settle(guard)

    def mark(self, tr_loss: Any) -> None:
        self._mark = tr_loss.detach().clone()  # a log reset it to 0 in place

    def _settle(self, guard: Any) -> None:
        pending = guard.pending_step  # the device path decides a step late
        skipped = {
            h["step"] for h in guard.history[self.history_from :] if h.get("action") == "skip"
        }
        for step in [s for s in self._added if pending is None or s < pending]:
            added = self._added.pop(step)
            if step in skipped:
                self.steps.append(step)
                self._skipped = added if self._skipped is None else self._skipped + added

    def correct(
        self,
        logs: dict[str, Any],
        trained: int,
        guard: Any,
        mean_over_ranks: Callable[[Any], Any] | None = None,
    ) -> dict[str, Any]:
        """Take the skipped steps out of the summary's `train_loss` (= sum / `trained`, the
        steps of this call) in place; the skipped-updates summary. `mean_over_ranks` (several
        processes: every rank calls it) averages what each rank's sum held of the skipped
        steps, as the Trainer averages the sums it logs."""
        self._settle(guard)
        own = logs["train_loss"]
        summary = skipped_updates(self.steps, HF_EXCLUDES)
        summary["train_loss_with_skipped"] = own
        skipped = self._skipped
        if mean_over_ranks is not None and self._mark is not None:
            # A collective: every rank takes part, whatever it skipped (the guard's decisions
            # agree over ranks, so all of them or none have steps here).
            skipped = mean_over_ranks(self._mark * 0 if skipped is None else skipped)
        if self.steps:
            removed = float(skipped.item())  # one host read, at the end
            applied = trained - len(self.steps)
            total = own * max(trained, 0.001)  # the Trainer's own divisor
            logs["train_loss"] = (total - removed) / applied if applied > 0 else float("nan")
            logs["train_loss_with_skipped"] = own
            logs["train_loss_skipped_updates"] = len(self.steps)
        return summary
