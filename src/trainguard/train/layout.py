"""How `trainguard run` lays its state out in a checkpoint folder: the `Layout` the run's
`Checkpointer` writes and reads through (`checkpoint/layout.py`), keeping the files `eval`,
`report`, `check-tokenizer` and the drills read (train/checkpoint_files.py).

The run checkpoints one state dict:

    {"model": model, "optimizer": optimizer, "sampler": sampler, "progress": progress,
     "guard": guard, "callbacks": callbacks}

The Checkpointer does the rest: rank 0 writes, temp name, manifest last, verification, fallback
past damaged steps, quarantine, retention, every rank's generator states. Before rank 0 accepts
a step it calls `check`, which reads every file against the model, optimizer and sampler
without changing them: a step that verifies but does not load (C111) is passed over like a
corrupt one, and the run never holds a half-loaded model.
"""

from __future__ import annotations

from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from safetensors.torch import load_model

from trainguard.checkpoint.folder import listed_path
from trainguard.checkpoint.inventory import unloadable
from trainguard.checkpoint.layout import Part
from trainguard.checkpoint.staging import Staging, one_thread
from trainguard.data.order import LoaderState
from trainguard.findings import Finding
from trainguard.train.checkpoint_files import (
    MODEL_FILE,
    READ_FILES,
    CheckpointContent,
    CheckpointFiles,
    UnloadableCheckpoint,
    read_checkpoint,
    write_checkpoint_files,
)
from trainguard.train.schedule import LrSchedule

KEYS = ("model", "optimizer", "sampler", "progress", "guard", "callbacks")


@dataclass
class Progress:
    """The loop's own counters: completed steps (= the logged number of the last step) and
    the tokens trained on."""

    step: int = 0
    tokens_seen: int = 0

    def advance(self, tokens: int) -> None:
        self.step += 1
        self.tokens_seen += tokens

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "tokens_seen": self.tokens_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])


class RunLayout:
    """The run's checkpoint files (see the module docstring). `recipe` and `env` are written
    with every checkpoint; `on_written(step)` runs once the payload is on disk and before the
    manifest (fire drills kill the process there: `kill@N:checkpoint_write`)."""

    name = "trainguard-run/1"
    reads_unmarked = True  # run's checkpoints from before the Checkpointer have no layout entry
    files = READ_FILES  # a step whose manifest lacks one is passed over (C111)

    def __init__(
        self,
        recipe: dict[str, Any],
        env: dict[str, Any],
        on_written: Callable[[int], None] | None = None,
    ) -> None:
        # recipe.yaml's text: rendered once (pure-Python YAML is most of a small write's CPU).
        self.recipe = yaml.safe_dump(recipe, sort_keys=False)
        self.env = env
        self.on_written = on_written
        self._checked: dict[str, CheckpointContent] = {}  # rank 0 reads a step once
        # The copies asynchronous saves write from: one set per snapshot the Checkpointer
        # may hold at once (its `queue`), the one the next save fills named by `use_slot`.
        self.stagings = [Staging()]
        self.slot = 0
        self.loaded_env: dict[str, Any] | None = None  # env.json of the step `read` restored
        self.schedule: LrSchedule | None = None
        """The LR schedule the run trains on, saved in trainer.json (`schedule`)."""
        self.loaded_schedule: list[dict[str, Any]] | None = None  # the restored step's, if any

    @property
    def staging(self) -> Staging:
        """The copy buffers the next snapshot fills."""
        return self.stagings[self.slot]

    def use_slot(self, slot: int) -> None:
        """Fill slot `slot`'s buffers at the next snapshot: the Checkpointer names one that no
        queued or running write reads (`SaveQueue.free_slot`)."""
        while len(self.stagings) <= slot:
            self.stagings.append(Staging())
        self.slot = slot

    def snapshot(self, parts: list[Part], rng: list[dict[str, Any]], copy: bool) -> Any:
        files = self._files(parts, rng, copy)
        if copy:  # an asynchronous save: the loop changes the originals right after this
            with one_thread():  # checkpoint/staging.py says why
                self._copy_into(files, parts, self.staging)
        else:
            files.optimizer = _by_key(parts)["optimizer"].value.state_dict()
        return files

    def stage(
        self, parts: list[Part], rng: list[dict[str, Any]]
    ) -> tuple[CheckpointFiles, Callable[[], None] | None]:
        """`snapshot(copy=True)`'s files, less the weights and the optimizer state: the
        callable copies those, in the Checkpointer's writer thread, while the loop runs its
        next forward and backward, which change neither (`Checkpointer(background_copy=True)`:
        the loop waits for the copy before its update). A model with buffers is copied now (no
        callable): a forward may change them (BatchNorm's running statistics)."""
        if next(_by_key(parts)["model"].value.buffers(), None) is not None:
            return self.snapshot(parts, rng, True), None
        files, staging = self._files(parts, rng, True), self.staging  # the slot of this save
        return files, lambda: self._copy_into(files, parts, staging)

    def _copy_into(self, files: CheckpointFiles, parts: list[Part], staging: Staging) -> None:
        p = _by_key(parts)
        files.model = staging.model(p["model"].value)
        files.optimizer = staging.tree(p["optimizer"].value.state_dict())

    def _files(self, parts: list[Part], rng: list[dict[str, Any]], copy: bool) -> CheckpointFiles:
        """The files of a checkpoint of `parts` now, but for the weights and the optimizer
        state (`model` the live module and `optimizer` None until the caller fills them); with
        `copy`, the small state (counters, the sampler, the guard, the callbacks) is a copy."""
        p = _by_key(parts)
        progress, sampler = p["progress"].value, p["sampler"].value
        trainer = progress.state_dict() | {
            "loader": self._loader(sampler, progress.step),
            "skipped_positions": sampler.skipped_positions,
            "guard": p["guard"].value.state_dict(),
            "callbacks": p["callbacks"].value.state_dict(),
            "schedule": self.schedule.to_list() if self.schedule is not None else [],
        }
        if copy:  # rng was captured for this save alone (capture_rng): nothing else changes it
            trainer = deepcopy(trainer)
        return CheckpointFiles(
            model=p["model"].value,
            optimizer=None,
            rng=rng,
            trainer=trainer,
            loader=dict(trainer["loader"]),
            recipe=self.recipe,
            env=self.env,
        )

    @staticmethod
    def _loader(sampler: Any, step: int) -> dict[str, int]:
        """Where step `step` (0-based: the next one) reads, for humans and for the check."""
        return LoaderState.at(sampler.position(step), sampler.num_samples).to_dict()

    def write(self, folder: Path, snapshot: CheckpointFiles) -> None:
        write_checkpoint_files(folder, snapshot)
        if self.on_written is not None:
            self.on_written(snapshot.trainer["step"])

    def check(self, folder: Path, parts: list[Part], step: int) -> list[Finding]:
        """C111 when a file of step `step` does not fit the run's objects; nothing changes."""
        p = _by_key(parts)
        try:
            content = read_checkpoint(
                folder, p["model"].value, p["optimizer"].value, p["sampler"].value, step
            )
        except UnloadableCheckpoint as e:
            return [unloadable(step, folder, e.file, e.why)]
        self._checked = {str(folder): content}  # `read` takes it from here on rank 0
        return []

    def read(
        self, folder: Path, parts: list[Part], state: dict[str, Any], step: int
    ) -> list[dict[str, Any]]:
        """Restore every object in place from a step `check` accepted (on rank 0) or that rank
        0 chose (elsewhere: checked here first); returns every rank's generator states."""
        p = _by_key(parts)
        model, optimizer, sampler = p["model"].value, p["optimizer"].value, p["sampler"].value
        content = self._checked.pop(str(folder), None)
        if content is None:
            try:
                content = read_checkpoint(folder, model, optimizer, sampler, step)
            except UnloadableCheckpoint as e:
                raise UnloadableCheckpoint(e.file, f"checkpoint step {step}: {e.why}") from None
        # load_model, not load_file + load_state_dict: it restores tied weights stored once.
        with listed_path(folder, MODEL_FILE) as path:
            load_model(model, path, strict=True)
        optimizer.load_state_dict(content.optimizer)
        trainer = content.trainer
        sampler.load_state_dict(trainer["sampler"].state_dict())
        p["progress"].value.load_state_dict(trainer)
        p["guard"].value.load_state_dict(trainer["guard"])
        p["callbacks"].value.load_state_dict(trainer["callbacks"])
        self.loaded_env = content.env
        self.loaded_schedule = trainer["schedule"]
        return content.rng


def _by_key(parts: list[Part]) -> dict[str, Part]:
    by_key = {p.key: p for p in parts}
    missing = [k for k in KEYS if k not in by_key]
    if missing:
        raise ValueError(f"the run's checkpoint state lacks {missing}")
    return by_key
