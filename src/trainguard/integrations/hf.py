"""Hugging Face `Trainer` adapter: `GuardedTrainer` (or `GuardedTrainerMixin` for a Trainer
subclass of your own) and its `TrainguardCallback`.

    trainer = GuardedTrainer(model=model, args=args, train_dataset=ds, guard=Guard(run_dir=out))
    trainer.train(resume_from_checkpoint=True)   # the newest checkpoint-N that verifies

Why a Trainer subclass and not only a callback: the Trainer clips the gradients
(`max_grad_norm`, 1.0 by default) before `on_pre_optimizer_step`, the first hook after the
backward pass, so a callback only ever sees the clipped norm: a 1000x spike looks like any other
step. And no hook receives the step's loss: `on_log` gets the average over `logging_steps` with
NaNs filtered out, after the update. `GuardedTrainer.training_step` (the Trainer's documented
override point) sums the micro-batch losses of the optimizer step and, on its last micro-batch
(the gradients complete and, under DDP, all-reduced), scores that loss and the pre-clip gradient
norm with `Guard.step` before the Trainer clips and steps. The callback, which the trainer
installs itself, does what happens after the update: the distributed guards, no save after a
rollback or halt decision, each `checkpoint-N` saved with the guard's state and a manifest, and
the `save_total_limit` rotation after that commit, with every folder it lets go verified first
(one that fails is moved to `quarantine/`, never deleted; the Trainer's own deletions, which do
not verify, are suspended: its rotation inside each save, and its last deletion at the end of
training with `save_total_limit=1` and a best folder, done verified once training has ended).
With `load_best_model_at_end` the best folder is verified before the Trainer loads it: one that
fails is reported, quarantined and not loaded (the model keeps its final weights).

Per optimizer step (counted from 0 like every trainguard step: the Trainer's `global_step`
before the update):
- skip: the gradients are dropped before clipping, so `optimizer.step()` changes nothing (torch
  optimizers pass over parameters without gradients: no update, no moment or weight-decay
  change, no step count). The Trainer still advances `global_step` and steps the LR scheduler:
  the batch is consumed, as in `trainguard run`.
- rollback (R104 divergence, R204 repeated skips, H201 replicas): no update, no save; training
  stops, `Guard.rollback` restores the guard and the sampler from the newest `checkpoint-N`
  (N <= this step) that verifies and makes the sampler skip the bad steps' samples at or after
  N, and `train()` resumes from that folder by itself (weights, optimizer, scheduler, RNG,
  `global_step` = N). Step N then reads the next global batch no rollback marked bad.
- halt (R203): no update, no save; `train()` raises RunHalted.

`train_loss` (the end-of-training summary and `train()`'s output): the Trainer's own averages
every step it ran, a skipped spike and the stand-in its `logging_nan_inf_filter` makes up for a
NaN included; here it averages the applied updates only (`hf_loss.SkippedLoss`), the Trainer's
kept as `train_loss_with_skipped`, and `trainer.skipped_updates` says which steps were left out.

Data: the training sampler is an `ElasticSampler` (`trainer.elastic_sampler`) over the whole
run (`max_steps` is required), its global batch the Trainer's total train batch size; the
Trainer's own resume skips the first N steps' batches. Under torchrun/accelerate with DDP, the
default guard is `Guard(distributed=True)`: the step's metrics are averaged over the ranks so
every rank decides alike, phases are timed (stragglers, H202; the Trainer's saves and
evaluations are left out: only rank 0 writes the checkpoint), replicas are compared before each
save (H201), and a hung rank is named (R301). FSDP2 through accelerate is judged on the host
with the whole model's gradient norm; DeepSpeed, FSDP1 and other untested parallelisms are
refused when the trainer is built (`hf_parallel.py`).

On CUDA (`decide_on` "auto"), one process, no fp16 GradScaler: `Guard.judge` decides on the
device with no host sync and masks the Trainer's own `optimizer.step()` there; the decision is
read back with the next step, or before a save, an evaluation or the end. A refused step is
rerun when the guard asks (R205 hardware / R206 data): its micro-batches and RNG state are kept
(`step_inputs.py`) and replayed through the Trainer's own `training_step`.
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from accelerate.utils import broadcast_object_list  # the Trainer's own dependency
    from transformers import Trainer
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "trainguard.integrations.hf needs Hugging Face transformers: pip install 'trainguard[hf]'"
    ) from e

from trainguard.data.sampler import ElasticSampler
from trainguard.errors import ConfigError
from trainguard.guard.core import Guard, grad_norm_of
from trainguard.guard.decision import Decision
from trainguard.guard.judgement import Judgement
from trainguard.integrations.hf_callback import TrainguardCallback
from trainguard.integrations.hf_checkpoints import (
    TrainerCheckpoints,
    resume_folder,
    rotate_verified,
    verified_best,
)
from trainguard.integrations.hf_loss import SkippedLoss
from trainguard.integrations.hf_parallel import check_parallelism
from trainguard.integrations.step_inputs import StepInputs
from trainguard.integrations.verified import quarantine_folder

log = logging.getLogger(__name__)
__all__ = ["GuardedTrainer", "GuardedTrainerMixin", "TrainguardCallback"]


def _default_guard(args: Any) -> Guard:
    distributed = args.world_size > 1
    # One guard.jsonl per job: the ranks take the same decisions; rank 0 records them.
    return Guard(
        run_dir=args.output_dir if args.process_index == 0 else None, distributed=distributed
    )


class GuardedTrainerMixin:
    """Mix into a `transformers.Trainer` subclass (first in the bases): `class MyTrainer(
    GuardedTrainerMixin, SFTTrainer)`. Extra keywords: `guard` (default: `Guard(run_dir=
    args.output_dir)`, distributed under a multi-process launch); `check_chat` (True or a dict
    of options: the chat-data pre-flight on the dataset and collator before a fresh start,
    `integrations/hf_chat.py`)."""

    args: Any
    state: Any
    control: Any
    optimizer: Any
    accelerator: Any
    train_dataset: Any
    model_wrapped: Any

    def __init__(
        self,
        *args: Any,
        guard: Guard | None = None,
        check_chat: bool | dict[str, Any] = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        check_parallelism(self)  # DeepSpeed, FSDP1, ...: refused before any step
        self.guard = guard if guard is not None else _default_guard(self.args)
        self.check_chat = check_chat
        self.chat_findings: list[Any] = []
        self.elastic_sampler: ElasticSampler | None = None
        self.checkpoint_findings: list[Any] = []  # checkpoints passed over on resume/rollback
        self.stop_decision: Decision | None = None  # the rollback or halt that stopped train()
        self._step_loss: Any = None
        self._judgement: Judgement | None = None  # the step whose update the Trainer does now
        # Each step's micro-batches, replayed when the guard asks for a rerun (R205/R206).
        self._inputs = StepInputs(
            self._micro_step,
            no_sync=lambda: self.accelerator.no_sync(self.model_wrapped),
            grad_norm=self._unscaled_norm,
        )
        self._skip_loss = SkippedLoss()
        # {"count", "steps", "train_loss_average", "train_loss_with_skipped"} after train()
        self.skipped_updates: dict[str, Any] | None = None
        self.add_callback(TrainguardCallback(self))  # type: ignore[attr-defined]

    # --- data ---------------------------------------------------------------------------------
    def _get_train_sampler(self, train_dataset: Any = None) -> ElasticSampler:
        return self._sampler()

    def _sampler(self) -> ElasticSampler:
        if self.elastic_sampler is None:
            a = self.args
            if a.max_steps <= 0:
                raise ConfigError(
                    "GuardedTrainer reads the data through trainguard's ElasticSampler, which "
                    "needs the run's length",
                    "set TrainingArguments(max_steps=...) instead of num_train_epochs",
                )
            for flag, why in (
                ("ignore_data_skip", "would replay the first batches after a resume or rollback"),
                ("auto_find_batch_size", "would change the global batch the data order is cut in"),
                ("save_only_model", "saves no optimizer state for a resume or rollback"),
            ):
                if getattr(a, flag, False):
                    raise ConfigError(
                        f"GuardedTrainer: {flag}=True {why}", f"leave TrainingArguments.{flag} off"
                    )
            if self.train_dataset is None or not hasattr(self.train_dataset, "__len__"):
                raise ConfigError(
                    "GuardedTrainer needs a map-style train_dataset (with __len__)",
                    "pass a torch Dataset or a datasets.Dataset, not an IterableDataset",
                )
            global_batch = self._train_batch_size * a.gradient_accumulation_steps * a.world_size
            seed = a.data_seed if a.data_seed is not None else a.seed
            # world_size=1: the sampler yields the global stream, which accelerate splits into
            # the ranks' micro-batches (each step = one block of `global_batch` samples).
            self.elastic_sampler = ElasticSampler(
                len(self.train_dataset), global_batch_size=global_batch, seed=seed, rank=0,
                world_size=1, max_steps=a.max_steps,
            )  # fmt: skip
        return self.elastic_sampler

    # --- the guarded step ---------------------------------------------------------------------
    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        step = self.state.global_step  # updates done before this one
        self._inputs.record(step, model, inputs, num_items_in_batch)  # for a rerun (R205/R206)
        with self.guard.phase("forward", step):  # a failed all-reduce names the hung rank
            loss = super().training_step(model, inputs, num_items_in_batch)  # type: ignore[misc]
        # Each micro-batch's loss is already divided by the accumulation: the sum is the step's.
        self._step_loss = loss if self._step_loss is None else self._step_loss + loss
        if self.accelerator.sync_gradients:  # the optimizer step's last micro-batch
            self._judge(model, step)
        return loss

    def _micro_step(self, model: Any, inputs: Any, num_items_in_batch: Any) -> Any:
        """One micro-batch's forward and backward as the Trainer does it (a rerun's)."""
        return super().training_step(model, inputs, num_items_in_batch)  # type: ignore[misc]

    def _unscaled_norm(self) -> Any:
        """The gradient norm before the Trainer clips; under fp16's GradScaler unscaled."""
        norm = grad_norm_of(self.model_wrapped)
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None and scaler.is_enabled():
            norm /= float(scaler.get_scale())
        return norm

    def _judge(self, model: Any, step: int) -> None:
        """`Guard.judge` before the Trainer clips (the unclipped norm) and steps: on the host,
        or on the device with the Trainer's own `optimizer.step()` masked (`on_step_end` ends
        the mask); the decision known now is settled (a rerun on the same micro-batches)."""
        loss, self._step_loss = self._step_loss, None
        scaler = getattr(self.accelerator, "scaler", None)
        scaled = scaler is not None and scaler.is_enabled()  # fp16: sets found_inf itself
        host = scaled or not self.guard.on_device(self.args.device)
        norm = self._unscaled_norm() if host else None  # the device path: a device tensor
        j = self.guard.judge(
            step, loss=loss, grad_norm=norm, model=model, optimizer=self.optimizer, on_host=host
        )
        self._settle_decision(j)
        j.begin_update(self.optimizer)
        self._judgement = j
        if self.guard.distributed is not None:
            self.guard.distributed.mark("optimizer")

    def _settle_decision(self, what: Any) -> None:
        """`Guard.settle` with the rerun of a step on its recorded micro-batches; a rollback or
        halt stops the Trainer (`train()` acts on it once the Trainer has returned)."""
        done = self.guard.settle(what, rerun=self._inputs.rerun, defer=True)
        if done.stop and self.stop_decision is None:
            self.stop_decision = done.decision
            self.control.should_training_stop = True

    def _settle(self, flush: bool) -> None:
        """After the Trainer's optimizer step: end the mask; with `flush`, read the pending
        step's decision back now (before a save, an evaluation or the end) and settle it."""
        if self._judgement is not None:
            self._judgement.end_update()
            self._judgement = None
        if flush:
            self._settle_decision(self.guard.flush())

    def _mark_between_steps(self, control: Any) -> None:
        """After a step: the straggler timer pauses while the Trainer evaluates or saves (only
        rank 0 writes the checkpoint: its busy time there would name it a straggler), and
        counts the next step's data phase otherwise."""
        if self.guard.distributed is None:
            return
        due = "checkpoint" if control.should_save else "eval" if control.should_evaluate else None
        self.guard.distributed.mark(due or "data")

    # --- saves and the end of training: nothing deleted or loaded unverified -----------------
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # The Trainer's own rotation (save_total_limit) runs here, before the callback writes
        # this folder's manifest, and deletes old folders unverified: suspended, and done by
        # the callback after the commit (`rotate_verified`: what fails verification is kept).
        limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
        finally:
            self.args.save_total_limit = limit

    # --- train_loss without the skipped updates --------------------------------------------
    def _maybe_log_save_evaluate(self, tr_loss: Any, *args: Any, **kwargs: Any) -> None:
        # Called after each update (before a log resets `tr_loss`) and at each epoch's end.
        self._skip_loss.after_step(self.state.global_step - 1, tr_loss, self.guard)
        super()._maybe_log_save_evaluate(tr_loss, *args, **kwargs)  # type: ignore[misc]
        self._skip_loss.mark(tr_loss)

    def log(self, logs: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        if "train_loss" in logs and "train_runtime" in logs:  # the end-of-training summary
            trained = self.state.global_step - getattr(self, "_initial_global_step", 0)
            several = self.args.world_size > 1
            mean = (lambda t: self.accelerator.reduce(t, reduction="mean")) if several else None
            self.skipped_updates = self._skip_loss.correct(logs, trained, self.guard, mean)
            if self.skipped_updates["count"]:
                log.warning(
                    "trainguard: train_loss %.6g averages the applied updates only; the %d "
                    "skipped (steps %s) are left out (the Trainer's own average with them: "
                    "train_loss_with_skipped %.6g)",
                    logs["train_loss"],
                    self.skipped_updates["count"],
                    self.skipped_updates["steps"],
                    logs["train_loss_with_skipped"],
                )
        super().log(logs, *args, **kwargs)  # type: ignore[misc]

    def _finalize_training(self, *args: Any, **kwargs: Any) -> Any:
        # With save_total_limit=1 and a best folder the Trainer deletes every other folder
        # here, unverified: suspended (only then: other callbacks keep reading the limit), and
        # done verified once training has ended normally (`_end`), never at a rollback's stop,
        # whose target it could delete. So the deletion now follows on_train_end.
        limit = self.args.save_total_limit
        if limit == 1:
            self.args.save_total_limit = None
        try:
            output = super()._finalize_training(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.args.save_total_limit = limit
        if self.stop_decision is None:
            self._end()
        if isinstance(output.metrics, dict) and "train_loss" in output.metrics:  # corrected
            output = output._replace(training_loss=output.metrics["train_loss"])
        return output

    def _end(self) -> None:
        """The Trainer's last deletion (`save_total_limit=1` with a best folder: every other
        folder goes), each folder verified first."""
        best = self.state.best_model_checkpoint
        if self.args.save_total_limit == 1 and best is not None and self.args.should_save:
            self._report(rotate_verified(self.args.output_dir, 1, best, keep_newest=False))
        self.accelerator.wait_for_everyone()

    def _load_best_model(self) -> None:
        """`load_best_model_at_end`: the best folder verified first (by the saving process,
        whose verdict every rank follows). One that fails is reported, moved to quarantine/ and
        not loaded: the model keeps its final weights."""
        best = self.state.best_model_checkpoint
        problems = verified_best(best) if self.args.should_save else []
        if not broadcast_object_list([bool(problems)])[0]:
            super()._load_best_model()  # type: ignore[misc]
            return
        if problems:
            self._report(quarantine_folder(str(best), problems))
        self.accelerator.wait_for_everyone()
        self.state.best_model_checkpoint = None  # nothing to load, nor to keep at the end
        log.warning("trainguard: the best checkpoint %s fails verification: not loaded", best)

    # --- train, resume, roll back -------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        """`Trainer.train`, resuming only from a checkpoint that verifies, and rolling back
        in-process when the guard asks for it. `resume_from_checkpoint=True`: the newest
        `checkpoint-N` that verifies (newer corrupt ones are reported and quarantined)."""
        if resume_from_checkpoint in (None, False):
            self.elastic_sampler = None  # a fresh start: no skips from an earlier train()
            if self.check_chat:  # before any step: PreflightFailed on an error finding
                from trainguard.integrations.hf_chat import chat_preflight

                options = self.check_chat if isinstance(self.check_chat, dict) else {}
                chat_preflight(self, options)  # sets self.chat_findings
        sampler = self._sampler()
        state = {"guard": self.guard, "sampler": sampler}
        if self.guard.record is not None:  # the run record: data order, arguments, checkpoints
            where = {"root": self.args.output_dir, "layout": "hf"}
            self.guard.record.attach(
                sampler=sampler, config=self.args, checkpoints=where, loop="hf trainer"
            )
        resume = resume_folder(self, resume_from_checkpoint, state)  # verified first
        while True:
            self.stop_decision, self._step_loss, self._judgement = None, None, None
            self._inputs.clear()
            self._skip_loss = SkippedLoss(len(self.guard.history))  # this call's steps only
            output = super().train(resume_from_checkpoint=resume, **kwargs)  # type: ignore[misc]
            stop = self.stop_decision
            if stop is None:
                return output
            stop.raise_if_halt()
            checkpoints = TrainerCheckpoints(self, at_most=stop.step)
            self.guard.rollback(checkpoints, state, sampler)  # RunHalted if none verifies
            self.checkpoint_findings += checkpoints.last_findings
            resume = str(checkpoints.folder)
            log.warning("trainguard: rolled back from step %s to %s", stop.step, resume)

    def _report(self, findings: list[Any]) -> None:
        self.checkpoint_findings += findings
        self.guard.report(findings)
        for f in findings:
            log.warning("trainguard: %s", f)


class GuardedTrainer(GuardedTrainerMixin, Trainer):
    """`transformers.Trainer` with trainguard's guard on every optimizer step."""
