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
Lightning sets up in `fit`). Automatic optimization only.

On CUDA (`GuardsConfig.decide_on`, "auto"; not with fp16's GradScaler or metrics averaged over
ranks): `Guard.step_async`, no host sync: the skip is decided on the device and Lightning's
optimizer step is masked there (`guard.masked_step.MaskedUpdate`); the decision is read back
with the next step, or before `VerifiedModelCheckpoint` saves and at the end.
"""

from __future__ import annotations

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
from trainguard.errors import ConfigError, RunHalted
from trainguard.guard.core import Guard, grad_norm_of
from trainguard.guard.decision import Decision
from trainguard.guard.device import PendingStep
from trainguard.guard.masked_step import MaskedUpdate
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
        self._masked: tuple[PendingStep, MaskedUpdate] | None = None  # the device path's
        self._trainer: Any = None
        self._restored_step = 0

    # --- the guarded step ---------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
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
        self._masked = None
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
        loss = loss.detach()
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None and scaler.is_enabled():  # fp16: the loss arrives scaled
            loss = loss / scaler.get_scale()
        self._step_loss = loss if self._step_loss is None else self._step_loss + loss

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        step = trainer.global_step  # updates done before this one
        loss, self._step_loss = self._step_loss, None
        self._judged, self._trainer = step, trainer
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        # fp16's GradScaler sets the optimizer's found_inf itself: the host path then.
        if (scaler is None or not scaler.is_enabled()) and self.guard.on_device(pl_module.device):
            # Judged on the device, the update masked there (Lightning steps next), the
            # previous step's decision acted on; before Lightning clips: the unclipped norm.
            pending = self.guard.step_async(step, loss=loss, model=pl_module)
            if pending.resolved is not None:
                self._stop_on(pending.resolved, trainer)
            if pending.dropped:  # the previous step stops the run: no update for this one
                optimizer.zero_grad(set_to_none=True)
            else:
                self._masked = (pending, MaskedUpdate(optimizer, pending.ok))
        else:
            decision = self.guard.step(
                step, loss=loss, grad_norm=grad_norm_of(pl_module), optimizer=optimizer
            )  # before Lightning clips: the unclipped norm
            self._stop_on(decision, trainer)
        if self.guard.distributed is not None:
            self.guard.distributed.mark("optimizer")

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._judged is None:  # an accumulation micro-batch: no update yet
            return
        step, self._judged = self._judged, None
        due = any(
            c.due(trainer) for c in trainer.callbacks if isinstance(c, VerifiedModelCheckpoint)
        )
        self.settle(trainer, flush=due or trainer.global_step >= trainer.max_steps)
        if self.stop_decision is None:
            end = self.guard.end_step(step, pl_module, trainer.optimizers[0], checkpoint_due=due)
            self._stop_on(end, trainer)
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
        """The device path, after Lightning's optimizer step: end the mask; with `flush`, read
        the pending step's decision back now (before a save, or at the end)."""
        if self._masked is not None:
            pending, mask = self._masked
            self._masked = None
            pending.repair = mask.end()
        if flush:
            decision = self.guard.flush()
            if decision is not None and self.stop_decision is None:
                self._stop_on(decision, trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.settle(trainer)

    def _stop_on(self, decision: Decision, trainer: Any) -> None:
        if decision.action in ("rollback", "halt"):
            self.stop_decision = decision
            trainer.should_stop = True

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
            raise RunHalted(
                f"the guard asked for a rollback at step {stop.step} but no checkpoint under "
                f"{ckpt.dirpath} verifies",
                "save checkpoints more often so a good state is on disk, or lower the "
                "learning rate",
            )
        path = str(v.folder / f"{CKPT_NAME}.ckpt")
