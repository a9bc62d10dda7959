"""The updates a guard skipped, and what the loop's own average training loss makes of them:
one shape for `trainguard run --json`, the run report and the Hugging Face adapter.

Facts, checked in the code: `trainguard run` averages no training loss (each step's loss goes to
metrics.jsonl as measured, a skipped step's too with `action: skip`; `final_val_loss` is measured
on held-out data after the applied updates only). The Hugging Face Trainer's `train_loss`
averages every step it ran, a skipped one included (a non-finite loss as the value its
`logging_nan_inf_filter` made up); `GuardedTrainer` takes the skipped steps out of it.
"""

from __future__ import annotations

from typing import Any

RUN_AVERAGE = (
    "none: trainguard run averages no training loss; each step's loss is in metrics.jsonl as "
    "measured (a skipped step's too, with action skip), and the validation loss is measured "
    "after the applied updates only"
)
HF_EXCLUDES = (
    "excludes: GuardedTrainer's train_loss averages the applied updates only (the Trainer's "
    "own average, skipped steps included, is train_loss_with_skipped)"
)


def skipped_updates(steps: list[int], average: str) -> dict[str, Any]:
    """{"count", "steps", "train_loss_average"}: `average` says whether the loop's own average
    training loss includes the skipped steps (RUN_AVERAGE, HF_EXCLUDES)."""
    return {"count": len(steps), "steps": sorted(steps), "train_loss_average": average}


OWN_AVERAGE = (
    "yours: the guard averages no training loss; each step's loss is in metrics.jsonl as "
    "measured (a skipped step's too, with action skip); an average your loop or framework logs "
    "includes the skipped steps unless it leaves them out itself"
)


def average_of(loop: str) -> str:
    """What the training-loss average of the loop that wrote a run record makes of skips."""
    if loop == "trainguard run":
        return RUN_AVERAGE
    return HF_EXCLUDES if loop == "hf trainer" else OWN_AVERAGE
