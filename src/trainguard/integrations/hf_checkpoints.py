"""trainguard's part of the Hugging Face Trainer's `checkpoint-N` folders.

After the Trainer has saved `checkpoint-N` (weights, optimizer, scheduler, RNG, trainer state),
`commit_checkpoint` adds `trainguard_state.json` (the guard's detector windows and counters, the
sampler's recorded skips) and then, last, the manifest (`integrations/verified.py`).
`TrainerCheckpoints` is `Guard.rollback`'s checkpointer over those folders; the Trainer restores
the rest when it resumes from the folder it found. `rotate_verified` is the Trainer's
`save_total_limit` rotation (at each save, and at the end of training) with every folder it
lets go verified first; `verified_best` checks the best folder before the Trainer loads it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from trainguard.checkpoint.folder import RefusedFile, open_listed
from trainguard.errors import BadInputError, CorruptError
from trainguard.findings import Finding
from trainguard.integrations.verified import (
    commit_folder,
    newest_verified,
    quarantine_if_invalid,
    quarantine_rejected,
    verify_folder,
)
from trainguard.util.nofollow import open_truncate

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
    with open_truncate(folder / STATE_FILE) as f:  # never through a link planted there
        f.write(json.dumps(saved))
    commit_folder(folder, step, {"writer": "trainguard.integrations.hf"})


def rotate_verified(
    output_dir: str | Path, limit: int | None, best: str | None, keep_newest: bool = True
) -> list[Finding]:
    """The Trainer's `save_total_limit` rotation, after the newest folder is committed:
    transformers' own rule (`trainer_utils.rotate_checkpoints`: the newest and the best folder
    kept, the oldest let go first, ordered by mtime or step), but each folder let go is
    verified first: deleted if it verifies, moved to quarantine/ if not (its findings and C112
    returned). `keep_newest=False` is the Trainer's rule at the end of training with
    `save_total_limit=1` and a best folder: only the best is kept. Call it from the process
    that saves."""
    from transformers.trainer_utils import sort_checkpoints

    if limit is None or limit <= 0:
        return []
    folders = sort_checkpoints(str(output_dir), PREFIX[:-1], use_mtime=True)
    newest = set(folders[-1:]) if keep_newest else set()
    protected = newest | ({str(Path(best))} if best is not None else set())
    remaining, keep = len(folders), max(limit, len(protected))
    found: list[Finding] = []
    for folder in folders:
        if remaining <= keep:
            break
        step = parse_checkpoint_dirname(Path(folder).name)
        if folder in protected or step is None:
            continue
        problems = quarantine_if_invalid(folder, step)
        if not problems:
            shutil.rmtree(folder)
        found += problems
        remaining -= 1
    return found


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
        with open_listed(folder, STATE_FILE) as f:  # verified: only what the manifest lists
            saved = json.loads(f.read().decode("utf-8"))
        for key, obj in state.items():
            obj.load_state_dict(saved[key])
    except (OSError, ValueError, KeyError, TypeError, RefusedFile) as e:
        raise CorruptError(
            f"{folder / STATE_FILE} does not hold the guard and sampler state: {e}",
            f"resume from a checkpoint a GuardedTrainer saved (it writes {STATE_FILE})",
        ) from None


def verified_best(best: str | None) -> list[Finding]:
    """`load_best_model_at_end`: the findings of the best `checkpoint-N` folder; [] when it
    verifies, and for no folder or one that is no `checkpoint-N` (the Trainer's own business:
    it says it cannot find it). The saving process calls it; a folder that fails goes to
    quarantine/ (`verified.quarantine_folder`)."""
    step = parse_checkpoint_dirname(Path(best).name) if best is not None else None
    if best is None or step is None or not Path(best).is_dir():
        return []
    return verify_folder(best, step)


def resume_folder(trainer: Any, resume: str | bool | None, state: dict[str, Any]) -> str | None:
    """`GuardedTrainer.train(resume_from_checkpoint=...)`'s folder, verified, with the guard's
    and the sampler's state loaded into `state`; None for a fresh start."""
    if resume is None or resume is False:
        return None
    if resume is True:
        checkpoints = TrainerCheckpoints(trainer)
        step = checkpoints.load_latest(state)
        trainer._report(checkpoints.last_findings)
        if step is None and not checkpoints.last_findings:
            raise BadInputError(
                f"resume_from_checkpoint=True but {trainer.args.output_dir} holds no {PREFIX}N "
                "folder",
                "pass resume_from_checkpoint=None to start training from scratch",
            )
        if step is None:
            raise CorruptError(
                f"C107: no {PREFIX}N folder under {trainer.args.output_dir} verifies "
                f"({len(checkpoints.last_findings)} findings; rejected folders are in "
                "quarantine/)",
                "restore a checkpoint from a copy, or train from scratch with "
                "resume_from_checkpoint=None in a new output_dir",
            )
        return str(checkpoints.folder)
    folder = Path(resume)
    step = parse_checkpoint_dirname(folder.name)
    if step is None:
        raise BadInputError(
            f"{folder} is not a {PREFIX}N folder",
            "pass a checkpoint folder the Trainer saved, or True for the newest that verifies",
        )
    problems = verify_folder(folder, step)
    if problems:
        trainer._report(problems)
        raise CorruptError(
            f"{folder} fails verification: " + "; ".join(f.message for f in problems),
            "resume_from_checkpoint=True takes the newest checkpoint that verifies",
        )
    load_state_file(folder, state)
    return str(folder)
