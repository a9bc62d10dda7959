"""`TrainguardCallback`: the part of the Hugging Face adapter that a Trainer callback does, after
each update and at each save (`integrations/hf.py` says why the rest needs a Trainer subclass).
`GuardedTrainerMixin` installs it; in a plain Trainer it refuses to start."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from transformers import TrainerCallback

from trainguard.errors import ConfigError
from trainguard.integrations.hf_checkpoints import PREFIX, commit_checkpoint, rotate_verified

if TYPE_CHECKING:
    from trainguard.data.sampler import ElasticSampler
    from trainguard.guard.core import Guard
    from trainguard.guard.decision import Decision


class GuardedTrainerHooks(Protocol):
    """What the callback uses of the trainer that installs it (`GuardedTrainerMixin` in
    `hf.py`); named here so that this module needs nothing of `hf.py`."""

    guard: Guard
    optimizer: Any
    accelerator: Any
    stop_decision: Decision | None

    def _settle(self, flush: bool) -> None: ...
    def _settle_decision(self, what: Decision | None) -> None: ...
    def _mark_between_steps(self, control: Any) -> None: ...
    def _sampler(self) -> ElasticSampler: ...
    def _report(self, findings: list[Any]) -> None: ...


class TrainguardCallback(TrainerCallback):
    """The part of the guard a callback can do, installed by `GuardedTrainer` itself: after each
    update the distributed guards; no save once a rollback or halt is decided; each saved
    `checkpoint-N` completed with the guard's and the sampler's state (`trainguard_state.json`)
    and, last, the manifest."""

    def __init__(self, trainer: GuardedTrainerHooks | None = None) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.trainer is None:
            raise ConfigError(
                "TrainguardCallback in a plain Trainer would see the clipped gradient norm "
                "and the loss averaged over logging_steps, after the update",
                "use trainguard.integrations.hf.GuardedTrainer (or mix GuardedTrainerMixin into "
                "your Trainer subclass): it installs this callback itself",
            )
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        t = self.trainer
        assert t is not None
        done = state.global_step - 1  # the update just applied (or skipped)
        due = control.should_save or control.should_evaluate or control.should_training_stop
        t._settle(flush=False)  # the mask of the device path ends
        if t.stop_decision is None:
            # The replicas (before a save), stragglers, the barrier; before a save, an
            # evaluation or the end also the device path's pending decision, read back.
            end = t.guard.after_update(
                done, kwargs.get("model"), t.optimizer, checkpoint_due=bool(due)
            )
            t._settle_decision(end)
            t._mark_between_steps(control)
        if t.stop_decision is not None:
            t._settle(flush=True)  # nothing stays pending across a rollback or a halt
            control.should_save = False  # never save a state a rollback is about to undo
            control.should_training_stop = True
        return control

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.trainer is not None:
            self.trainer._mark_between_steps(control)  # a save may still follow
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.trainer is not None:  # a step still pending (the device path) is settled
            self.trainer._settle(flush=True)
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.trainer is not None and self.trainer.stop_decision is not None:
            control.should_save = False
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        t = self.trainer
        assert t is not None
        t.accelerator.wait_for_everyone()  # every rank's files (rng_state_<r>.pth) are written
        if args.should_save:
            folder = Path(args.output_dir) / f"{PREFIX}{state.global_step}"
            commit_checkpoint(folder, state.global_step, t.guard, t._sampler())
            rotated = rotate_verified(
                args.output_dir, args.save_total_limit, state.best_model_checkpoint
            )
            t._report(rotated)  # folders kept in quarantine/ instead of deleted
        t.accelerator.wait_for_everyone()  # nobody reads the folder before it is committed
        t._mark_between_steps(control)  # the save is over: the next step's data phase
        return control
