"""Lightning adapter: `TrainguardLightningCallback`, its `VerifiedModelCheckpoint` companion
and `fit`, which resumes from a verified checkpoint and rolls back in-process.

    sampler = ElasticSampler(len(ds), global_batch_size=32, seed=0)   # endless: max_steps ends it
    loader = DataLoader(ds, sampler=sampler, batch_size=32)
    guard_cb = TrainguardLightningCallback(sampler, guard=Guard(run_dir="runs/l"))
    ckpt = VerifiedModelCheckpoint("runs/l/checkpoints", every_n_train_steps=100)
    trainer = L.Trainer(max_steps=1000, gradient_clip_val=1.0, callbacks=[guard_cb, ckpt])
    fit(trainer, module, train_dataloaders=loader)

Per optimizer step (counted from 0: `trainer.global_step` before the update), in one decision:
`on_before_backward` adds up the step's loss (each micro-batch's, already divided by the
accumulation), and `on_before_optimizer_step`, which Lightning calls after the backward pass
and BEFORE it clips (`gradient_clip_val`), scores that loss and the unclipped gradient norm.
- skip: the gradients are dropped, so the optimizer step changes nothing (no update, no moment,
  weight-decay or step-count change); `global_step` and a per-step LR scheduler still advance.
- rollback (R104, R204, H201) or halt (R203): no update; training stops (`trainer.should_stop`)
  and the companion saves nothing more. `fit` then resumes from the newest `step-N` folder that
  verifies (N <= the step): Lightning restores the weights, optimizer, schedulers and loops, and
  this callback's `load_state_dict` completes `Guard.rollback`: the checkpoint's detector
  windows, the guard's own counters kept, the sampler's skips kept and the bad steps at or after
  N added. A halt raises RunHalted from `fit`.

State: the guard's and the sampler's state travel in the callback's `state_dict` (in every
Lightning checkpoint). Data: the `ElasticSampler` must be the train loader's sampler, endless
(no `max_steps`; the Trainer's `max_steps` ends the run): a resumed fit starts its iterator at
the restored step (Lightning cannot fast-forward a plain DataLoader). Under DDP build it with
`rank=trainer.global_rank, world_size=trainer.world_size` and pass
`Trainer(use_distributed_sampler=False)`; `Guard(distributed=True)` adds the replica, straggler
and hung-rank guards (build it before `fit`: the callback connects it to the process group
Lightning sets up in `fit`). Automatic optimization only; one device or DDP (DeepSpeed, FSDP and
other strategies are refused in `setup`, `check_strategy`). A refused step is rerun on its own
micro-batches when the guard asks (R205 hardware / R206 data; `step_inputs.py`).

On CUDA (`GuardsConfig.decide_on`, "auto"; not with fp16's GradScaler or metrics averaged over
ranks): `Guard.step_async`, no host sync: the skip is decided on the device and Lightning's
optimizer step is masked there (`guard.masked_step.MaskedUpdate`); the decision is read back
with the next step, or before `VerifiedModelCheckpoint` saves and at the end.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "trainguard.integrations.lightning needs Lightning: pip install 'trainguard[lightning]'"
    ) from e

from trainguard.checkpoint.manifest import MANIFEST
from trainguard.data.sampler import ElasticSampler
from trainguard.errors import ConfigError
from trainguard.guard.core import Guard, grad_norm_of
from trainguard.guard.decision import Decision
from trainguard.guard.judgement import Judgement
from trainguard.guard.rollback import no_checkpoint
from trainguard.integrations.lightning_strategy import check_strategy
from trainguard.integrations.step_inputs import StepInputs
from trainguard.integrations.verified import (
    Verified,
    commit_folder,
    newest_verified,
    quarantine_if_invalid,
    quarantine_rejected,
)

PREFIX = "step-"
CKPT_NAME = "checkpoint"


class _LoadedState:
    """`Guard.rollback`'s checkpointer once Lightning has read the checkpoint: `load_latest`
    hands the callback's saved state to the guard and the sampler."""

    def __init__(self, saved: dict[str, Any], step: int) -> None:
        self.saved, self.step = saved, step

    def load_latest(self, state: dict[str, Any]) -> int:
        for key, obj in state.items():
            obj.load_state_dict(self.saved[key])
        return self.step


class TrainguardLightningCallback(Callback):
    """The guard on every optimizer step of a Lightning `Trainer` (see the module docstring)."""

    def __init__(
        self, sampler: ElasticSampler, guard: Guard | None = None, run_dir: str | None = None
    ) -> None:
        if not isinstance(sampler, ElasticSampler):
            raise ConfigError(
                f"TrainguardLightningCallback needs the train loader's ElasticSampler, got "
                f"{type(sampler).__name__}",
                "build the DataLoader with sampler=trainguard.ElasticSampler(...) and pass it",
            )
        self.sampler = sampler
        self.guard = guard if guard is not None else Guard(run_dir=run_dir)
        self.stop_decision: Decision | None = None  # the rollback or halt that stopped fit
        self._step_loss: Any = None
        self._judged: int | None = None  # the step scored, until its update is done
        self._judgement: Judgement | None = None  # the step whose update Lightning does now
        self._trainer: Any = None
        self._inputs = StepInputs(self._micro_step, self._no_sync, self._rerun_norm)
        self._restored_step = 0

    # --- the guarded step ---------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        check_strategy(trainer.strategy)  # DeepSpeed, FSDP1, ...: refused before any step
        if self.sampler.world_size != trainer.world_size:
            raise ConfigError(
                f"the ElasticSampler slices for {self.sampler.world_size} ranks, the Trainer "
                f"runs {trainer.world_size}",
                "build it with rank=trainer.global_rank, world_size=trainer.world_size and pass "
                "Trainer(use_distributed_sampler=False)",
            )
        if self.sampler.max_steps is not None or trainer.max_steps < 0:
            raise ConfigError(
                "the ElasticSampler must be endless and the Trainer must end the run: a resumed "
                "fit restarts the loader's iterator at the restored step, and a sampler with a "
                "length would end Lightning's epoch early",
                "ElasticSampler(..., max_steps=None) and L.Trainer(max_steps=N)",
            )
        if self.guard.distributed is not None:  # Lightning has set up the process group now
            self.guard.distributed.connect()
        self.stop_decision, self._step_loss, self._judged = None, None, None
        self._judgement = None
        self._inputs.clear()
        self.sampler.set_step(0)  # a fresh fit; a restored checkpoint moves it (load_state_dict)
        if self.guard.record is not None:  # the run record: data order, hparams, checkpoints
            saver = next(
                (c for c in trainer.callbacks if isinstance(c, VerifiedModelCheckpoint)), None
            )
            where = {"root": saver.dirpath, "layout": "lightning"} if saver is not None else None
            config = dict(getattr(pl_module, "hparams", {}) or {}) or None
            self.guard.record.attach(
                sampler=self.sampler, config=config, checkpoints=where, loop="lightning"
            )

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.mark("backward")  # the all-reduce ends in here: the others' wait, not a lag
        loss = loss.detach()
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None and scaler.is_enabled():  # fp16: the loss arrives scaled
            loss = loss / scaler.get_scale()
        self._step_loss = loss if self._step_loss is None else self._step_loss + loss

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self.mark("forward")  # the batch is fetched: a slow loader shows in the data phase (H202)
        # Each step's micro-batches, replayed when the guard asks for a rerun (R205/R206).
        self._inputs.record(trainer.global_step, batch, batch_idx)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        step = trainer.global_step  # updates done before this one
        loss, self._step_loss = self._step_loss, None
        self._judged, self._trainer = step, trainer
        # fp16's GradScaler sets the optimizer's found_inf itself: the host path then. Judged
        # before Lightning clips (the unclipped norm); on the device the update is masked there
        # (Lightning steps next); the decision known now is settled.
        host = self._scale(trainer) is not None or not self.guard.on_device(pl_module.device)
        j = self.guard.judge(
            step,
            loss=loss,
            grad_norm=grad_norm_of(pl_module) if host else None,
            model=pl_module,
            optimizer=optimizer,
            on_host=host,
        )
        self._settle_decision(j, trainer)
        j.begin_update(optimizer)
        self._judgement = j
        if self.guard.distributed is not None:
            self.guard.distributed.mark("optimizer")

    @staticmethod
    def _scale(trainer: Any) -> float | None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None

    def _micro_step(self, batch: Any, batch_idx: int) -> Any:
        """One micro-batch's forward and backward as Lightning's automatic optimization does
        it (through the strategy: DDP's wrapper, the precision's autocast), for a rerun."""
        trainer = self._trainer
        out = trainer.strategy.training_step(batch, batch_idx)
        loss = (out["loss"] if isinstance(out, dict) else out) / trainer.accumulate_grad_batches
        scale = self._scale(trainer)
        (loss * scale if scale is not None else loss).backward()
        return loss

    def _rerun_norm(self) -> float:
        """The rerun's gradient norm as the step's was judged (fp16: unscaled)."""
        norm = grad_norm_of(self._trainer.lightning_module)
        scale = self._scale(self._trainer)
        return norm / scale if scale is not None else norm

    def _no_sync(self) -> Any:
        block = getattr(self._trainer.strategy, "block_backward_sync", None)
        return block() if block is not None else contextlib.nullcontext()

    def _settle_decision(self, what: Any, trainer: Any) -> None:
        """`Guard.settle` with the rerun on the recorded micro-batches; a rollback or halt
        stops the Trainer (`fit` acts on it once Lightning has returned)."""
        done = self.guard.settle(what, rerun=self._inputs.rerun, defer=True)
        if done.stop and self.stop_decision is None:
            self.stop_decision = done.decision
            trainer.should_stop = True

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._judged is None:  # an accumulation micro-batch: no update yet
            return
        step, self._judged = self._judged, None
        due = any(
            c.due(trainer) for c in trainer.callbacks if isinstance(c, VerifiedModelCheckpoint)
        )
        last = trainer.global_step >= trainer.max_steps
        self.settle(trainer, flush=False)  # the mask of the device path ends
        if self.stop_decision is None:
            # Replicas, stragglers, the barrier; before a save or at the end also the device
            # path's pending decision, read back.
            end = self.guard.after_update(
                step, pl_module, trainer.optimizers[0], checkpoint_due=due or last
            )
            self._settle_decision(end, trainer)
        if self.stop_decision is not None:
            self.settle(trainer, flush=True)  # nothing stays pending across a rollback or halt
        # The straggler timer pauses while the companion saves (only rank 0 writes: its busy
        # time there is not a slow chip); `VerifiedModelCheckpoint` restarts it after the save.
        self.mark("checkpoint" if due else "data")

    def mark(self, phase: str) -> None:
        """The straggler timer's phase (the distributed part's; nothing without one)."""
        if self.guard.distributed is not None:
            self.guard.distributed.mark(phase)

    def settle(self, trainer: Any, flush: bool = True) -> None:
        """After Lightning's optimizer step: end the mask of the device path; with `flush`,
        read the pending step's decision back now (before a save, or at the end) and settle
        it."""
        if self._judgement is not None:
            self._judgement.end_update()
            self._judgement = None
        if flush:
            self._settle_decision(self.guard.flush(), trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.settle(trainer)

    # --- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._trainer is not None:  # a save outside the companion's: settle first
            self.settle(self._trainer)
        return {
            "version": 1,
            "guard": self.guard.state_dict(),
            "sampler": self.sampler.state_dict(),
        }

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._restored_step = int(checkpoint["global_step"])  # before load_state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        step = self._restored_step
        state = {"guard": self.guard, "sampler": self.sampler}
        if self.guard.pending_rollback is not None:  # `fit` is rolling back to this checkpoint
            self.guard.rollback(_LoadedState(state_dict, step), state, self.sampler)
        else:
            _LoadedState(state_dict, step).load_latest(state)
        self.sampler.set_step(step)  # the resumed iterator starts at the restored step


class VerifiedModelCheckpoint(ModelCheckpoint):
    """A `ModelCheckpoint` whose every checkpoint is a verified folder:
    `dirpath/step-N/checkpoint.ckpt` and, written last, `dirpath/step-N/manifest.json`. It saves
    nothing once the guard has decided a rollback or halt; a folder the top-k rule lets go is
    verified first and, if it fails, moved to `dirpath/quarantine/` instead of deleted.
    `save_last` and `filename` are not supported (the folder layout is fixed); other arguments
    are ModelCheckpoint's."""

    def __init__(self, dirpath: str | Path, **kwargs: Any) -> None:
        for key in ("filename", "save_last", "auto_insert_metric_name"):
            if kwargs.get(key) is not None:
                raise ConfigError(
                    f"VerifiedModelCheckpoint fixes the checkpoint layout; {key}= is not supported",
                    "leave it out: checkpoints are dirpath/step-N/checkpoint.ckpt",
                )
        super().__init__(
            dirpath=str(dirpath),
            filename=f"{PREFIX}{{step}}/{CKPT_NAME}",
            auto_insert_metric_name=False,
            enable_version_counter=False,
            **kwargs,
        )

    def due(self, trainer: Any) -> bool:
        """Will `on_train_batch_end` save at this step (every_n_train_steps)?"""
        n = self._every_n_train_steps
        return n >= 1 and trainer.global_step % n == 0

    def _should_skip_saving_checkpoint(self, trainer: Any) -> bool:
        guards = [c for c in trainer.callbacks if isinstance(c, TrainguardLightningCallback)]
        for c in guards:  # the device path: the step's decision is read back before a save
            c.settle(trainer)
        stopping = any(c.stop_decision is not None for c in guards)
        return stopping or super()._should_skip_saving_checkpoint(trainer)

    def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)  # every rank; rank 0 writes
        if trainer.is_global_zero:
            commit_folder(Path(filepath).parent, trainer.global_step, {"writer": "lightning"})
        trainer.strategy.barrier("trainguard.manifest")
        for c in trainer.callbacks:  # the save is over: the next step's data phase
            if isinstance(c, TrainguardLightningCallback):
                c.mark("data")

    def _remove_checkpoint(self, trainer: Any, filepath: str) -> None:
        """The top-k rule let this step folder go: deleted if it verifies, else quarantined
        (nothing that fails verification is deleted: it is the evidence)."""
        folder = Path(filepath).parent
        if trainer.is_global_zero and folder.is_dir():
            step = int(folder.name[len(PREFIX) :])  # this companion named it step-N
            problems = quarantine_if_invalid(folder, step)
            if problems:
                for c in trainer.callbacks:
                    if isinstance(c, TrainguardLightningCallback):
                        c.guard.report(problems)
                return
        super()._remove_checkpoint(trainer, filepath)  # every rank; rank 0 deletes
        if trainer.is_global_zero:  # the rest of the folder
            (folder / MANIFEST).unlink(missing_ok=True)
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()

    def newest_verified(self, trainer: Any, guard: Guard, at_most: int | None = None) -> Verified:
        """The newest `step-N` folder that verifies; the newer ones reported to the guard and
        moved to `dirpath/quarantine/` by global rank 0. Call it on every rank: the others only
        read (a folder rank 0 moves away mid-scan is one that failed anyway)."""
        v = newest_verified(self.dirpath, PREFIX, at_most=at_most)
        moved = quarantine_rejected(v) if trainer.is_global_zero else []
        guard.report(v.findings + moved)
        return v


def _companions(trainer: Any) -> tuple[TrainguardLightningCallback, VerifiedModelCheckpoint]:
    guards = [c for c in trainer.callbacks if isinstance(c, TrainguardLightningCallback)]
    ckpts = [c for c in trainer.callbacks if isinstance(c, VerifiedModelCheckpoint)]
    if len(guards) != 1 or len(ckpts) != 1:
        raise ConfigError(
            f"fit needs one TrainguardLightningCallback and one VerifiedModelCheckpoint in the "
            f"Trainer's callbacks, found {len(guards)} and {len(ckpts)}",
            "Trainer(callbacks=[TrainguardLightningCallback(sampler), "
            "VerifiedModelCheckpoint(dirpath, every_n_train_steps=...)])",
        )
    return guards[0], ckpts[0]


def fit(trainer: Any, model: Any, *, resume: bool = True, **fit_kwargs: Any) -> None:
    """`trainer.fit(model, **fit_kwargs)` from the newest checkpoint that verifies (`resume`),
    rolling back in-process whenever the guard asks for it (see the module docstring).
    Checkpoints are loaded with `weights_only=True` (no arbitrary unpickling: hyperparameters
    saved with `save_hyperparameters` must be plain values)."""
    cb, ckpt = _companions(trainer)
    path = None
    if resume:
        v = ckpt.newest_verified(trainer, cb.guard)
        path = str(v.folder / f"{CKPT_NAME}.ckpt") if v.folder is not None else None
    while True:
        trainer.fit(model, ckpt_path=path, weights_only=True, **fit_kwargs)
        stop = cb.stop_decision
        if stop is None:
            return
        stop.raise_if_halt()
        v = ckpt.newest_verified(trainer, cb.guard, at_most=stop.step)
        if v.folder is None:
            raise no_checkpoint(stop.step, f"none under {ckpt.dirpath} verifies")
        path = str(v.folder / f"{CKPT_NAME}.ckpt")
