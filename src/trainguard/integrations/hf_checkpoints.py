"""trainguard's part of the Hugging Face Trainer's `checkpoint-N` folders.

After the Trainer has saved `checkpoint-N` (weights, optimizer, scheduler, RNG, trainer state),
`commit_checkpoint` adds `trainguard_state.json` (the guard's detector windows and counters, the
sampler's recorded skips) and then, last, the manifest (`integrations/verified.py`).
`TrainerCheckpoints` is `Guard.rollback`'s checkpointer over those folders; the Trainer restores
the rest when it resumes from the folder it found.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainguard.errors import CorruptError
from trainguard.integrations.verified import commit_folder, newest_verified, quarantine_rejected

STATE_FILE = "trainguard_state.json"
PREFIX = "checkpoint-"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR + "-"


def parse_checkpoint_dirname(name: str) -> int | None:
    """N for `checkpoint-N`, None for anything else."""
    digits = name[len(PREFIX) :]
    if not name.startswith(PREFIX) or not digits.isdigit() or digits != str(int(digits)):
        return None
    return int(digits)


def commit_checkpoint(folder: Path, step: int, guard: Any, sampler: Any) -> None:
    """Add the guard's and the sampler's state to a folder the Trainer saved, then commit it."""
    saved = {"guard": guard.state_dict(), "sampler": sampler.state_dict()}
    (folder / STATE_FILE).write_text(json.dumps(saved), encoding="utf-8")
    commit_folder(folder, step, {"writer": "trainguard.integrations.hf"})


class TrainerCheckpoints:
    """`Guard.rollback`'s checkpointer over the Trainer's `checkpoint-N` folders: `load_latest`
    restores the guard and the sampler from the newest folder that verifies (N <= `at_most`);
    the Trainer restores everything else when `train` resumes from `folder`."""

    def __init__(self, trainer: Any, at_most: int | None = None) -> None:
        self.trainer, self.at_most = trainer, at_most
        self.folder: Path | None = None
        self.last_findings: list[Any] = []

    def load_latest(self, state: dict[str, Any]) -> int | None:
        t = self.trainer
        v = newest_verified(t.args.output_dir, PREFIX, at_most=self.at_most)  # on every rank
        t.accelerator.wait_for_everyone()
        moved = quarantine_rejected(v) if t.args.should_save else []  # by one process
        t.accelerator.wait_for_everyone()
        self.last_findings = v.findings + moved
        if v.folder is None:
            return None
        self.folder = v.folder
        load_state_file(v.folder, state)
        return v.step


def load_state_file(folder: Path, state: dict[str, Any]) -> None:
    """Restore the objects in `state` (guard, sampler) from a folder's trainguard_state.json."""
    try:
        saved = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
        for key, obj in state.items():
            obj.load_state_dict(saved[key])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptError(
            f"{folder / STATE_FILE} does not hold the guard and sampler state: {e}",
            f"resume from a checkpoint a GuardedTrainer saved (it writes {STATE_FILE})",
        ) from None
