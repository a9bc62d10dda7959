"""Where a run starts: the newest checkpoint that verifies and loads, or step 0 on purpose.

The run's `Checkpointer` (`open_checkpointer`) verifies every checksum, reads each candidate's
files against the model, optimizer and sampler without changing them (C111 names a file that
does not fit; the step is passed over), falls back past damaged steps, and only then restores.
Rank 0 chooses and every rank loads that step. When checkpoints exist but none can be used the
run stops (`load_or_refuse`, C107): starting over would truncate metrics.jsonl and prune the
damaged folders, the run's history and the evidence. Starting over is explicit: `start_fresh`
(`trainguard run --fresh`) moves everything aside into an attic, deleting nothing.

A restored checkpoint is then checked against the data prepared now (`refuse_changed_data`,
D104) before anything on disk changes, and described (`resumed_findings`: C150, H101).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.checkpoint.checkpointer_load import LegacyRunCheckpoint
from trainguard.checkpoint.failures import describe
from trainguard.checkpoint.local import ATTIC, free_path
from trainguard.checkpoint.store import CheckpointStore
from trainguard.codes.checkpoint import C107_IN_RUN
from trainguard.config.schema import Recipe
from trainguard.data.shards import compare_identity
from trainguard.errors import NoUsableCheckpoint, RunHalted, StorageError, TrainguardError
from trainguard.findings import Finding
from trainguard.guard.hang_report import read_hang_reports
from trainguard.metrics.jsonl import read_metrics
from trainguard.train.envinfo import drift_findings
from trainguard.train.refusals import refuse_blocked_attic
from trainguard.train.saving import checkpoint_queue
from trainguard.train.schedule import LrSchedule, resumed_schedule
from trainguard.util.atomic import fsync_dir
from trainguard.util.nofollow import move_within
from trainguard.util.paths import is_remote, local_path
from trainguard.util.runlock import LOCK_FILE


def checkpoint_root(recipe: Recipe, run_dir: Path) -> str:
    return recipe.checkpoint.dir or str(run_dir / "checkpoints")


def open_checkpointer(
    recipe: Recipe, run_dir: Path, on_phase: Callable[[str, int], None] | None = None
) -> Checkpointer:
    """The run's checkpointer (collective under torch.distributed): a path or any fsspec URL
    (`checkpoint.dir`) with its storage options; a remote one is fetched once per machine into
    the node cache (`$TRAINGUARD_CACHE/node`). With `checkpoint.async_save` (the default) a
    save writes in the background (`spine.save_checkpoint`), and copies the weights and the
    optimizer state there too, while the next step's forward and backward run (the step waits
    for the copy before its update: `spine.train_step`). `on_phase`: the Checkpointer's
    phases, for fire drills."""
    return Checkpointer(
        checkpoint_root(recipe, run_dir),
        keep=recipe.checkpoint.keep,
        storage_options=getattr(recipe.checkpoint, "storage_options", None) or None,
        on_phase=on_phase,
        async_save=recipe.checkpoint.async_save,
        background_copy=recipe.checkpoint.async_save,
        **checkpoint_queue(recipe),
    )


def probe_store(store: Checkpointer | CheckpointStore, root: str) -> None:
    """List the store once, before data preparation: a bucket without credentials is bad input
    (exit 2), an endpoint that does not answer a StorageError naming the root, found in
    seconds rather than after the data is prepared and the model built."""
    try:
        store.steps()
    except TrainguardError:
        raise
    except Exception as e:
        raise StorageError(
            f"cannot list the checkpoint store {root}: {describe(e)}",
            "check checkpoint.dir, its endpoint and the network (`trainguard doctor` tests the "
            "store), or use a local checkpoint.dir",
        ) from None


def load_or_refuse(checkpointer: Checkpointer, state: dict[str, Any], run_dir: Path) -> int | None:
    """Restore the newest usable checkpoint into `state` (None: none yet, step 0). When steps
    exist but none can be used: NoUsableCheckpoint (exit 1, C107), nothing changed. A step of
    the earlier run format: LegacyRunCheckpoint (exit 2) with the command for this run dir."""
    try:
        return checkpointer.load_latest(state)
    except LegacyRunCheckpoint as e:
        raise LegacyRunCheckpoint(e.step, e.root, shlex.quote(str(run_dir))) from None
    except NoUsableCheckpoint as e:
        none = [f for f in e.findings if f.code == "C107"]
        why = none[0].message if none else e.message
        raise NoUsableCheckpoint(
            f"C107: {why}; nothing was changed (metrics.jsonl and the checkpoint folders are as "
            "they were)",
            C107_IN_RUN,
            findings=e.findings,
        ) from None


def refuse_changed_data(
    step: int, meta: dict[str, Any], prepared: dict[str, Any], accept: bool
) -> list[Finding]:
    """D104: the checkpoint of `step` was trained on other data than the data prepared now
    (`meta`: its manifest's, `prepared`: `data_identity` of today's). Unless the user accepted
    the change (`--accept-data-change`; the findings returned say so, for the log), the run
    stops here (RunHalted, exit 1, carrying the findings) before anything on disk changes."""
    recorded = meta.get("data_identity")
    if recorded is None:
        return []
    found = compare_identity(recorded, prepared)
    if found and not accept:
        halted = RunHalted(
            f"not resuming from checkpoint step {step}: {found[0].message}; the same sample "
            "ids would now be different text (D104); nothing was changed",
            "resume with the original data (same source files and tokenizer settings), start "
            "a new run with --run-dir NEW_DIR, or continue on the new data on purpose with "
            "--accept-data-change",
        )
        halted.findings = found  # type: ignore[attr-defined]  (the run's result lists them)
        raise halted
    accepted = " (accepted: --accept-data-change)"
    return [dataclasses.replace(f, message=f.message + accepted) for f in found]


def resumed_findings(
    step: int, path: Path | None, saved_env: dict[str, Any] | None, env: dict[str, Any]
) -> list[Finding]:
    """H101 per software component changed since the checkpoint, then C150 (resumed from)."""
    drift = drift_findings(saved_env or {}, env, step) if saved_env is not None else []
    return [
        *drift,
        Finding.of(
            "C150",
            f"resumed from checkpoint step {step} ({path})",
            step=step,
            data={"path": str(path)},
        ),
    ]


def unlogged_hang_reports(run_dir: Path) -> list[Finding]:
    """The hang findings in RUN_DIR/hang-*.json that metrics.jsonl does not hold yet.

    A hung process (R210), hung rank (R301) or a dead rank's survivor (R302) writes its finding
    to hang-*.json and exits at once; the resume truncation also drops such rows (their step
    is past the checkpoint), and replaying the steps does not hang again. Keyed by stack file,
    so each hang is logged once however often the run resumes, and the log and report keep the
    run's whole history.
    """
    logged = {
        (row.get("data") or {}).get("stack_file")
        for row in read_metrics(run_dir)
        if row.get("kind") == "finding"
    }
    return [f for f in read_hang_reports(run_dir) if f.data.get("stack_file") not in logged]


# -- starting over on purpose ---------------------------------------------------------------------
def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def set_aside_run_dir(run_dir: Path, stamp: str) -> Path | None:
    """Move everything in `run_dir` but the lock file and the attic to
    `run_dir/attic/<stamp>/`; returns that folder, None if there was nothing to move."""
    if not run_dir.is_dir():
        return None
    entries = sorted(e for e in run_dir.iterdir() if e.name not in (LOCK_FILE, ATTIC))
    if not entries:
        return None
    dest = free_path(run_dir / ATTIC / stamp)
    for entry in entries:  # never through a link put in the attic's place after the check
        move_within(run_dir, entry.name, f"{ATTIC}/{dest.name}/{entry.name}")
    fsync_dir(run_dir)
    return dest


def start_fresh(recipe: Recipe, run_dir: Path) -> list[Finding]:
    """`trainguard run --fresh`: set the previous run aside (run dir contents, and the step
    folders of a checkpoint.dir outside the run dir) so the run starts at step 0; C113 says
    where it went. Call it in one process only (the launcher, or rank 0). An attic that is a
    symlink or a file is refused (BadInputError) before anything moves."""
    root = checkpoint_root(recipe, run_dir)
    local = None if is_remote(root) else local_path(root)
    inside = local is not None and local.resolve().is_relative_to(run_dir.resolve())
    refuse_blocked_attic(run_dir)
    if local is not None and not inside:
        refuse_blocked_attic(local)
    stamp = _stamp()
    moved = set_aside_run_dir(run_dir, stamp)
    where = [str(moved)] if moved else []
    if not inside and (local is None or local.is_dir()):
        store = CheckpointStore(
            root,
            keep=recipe.checkpoint.keep,
            storage_options=getattr(recipe.checkpoint, "storage_options", None) or None,
        )
        if store.set_aside(stamp):
            where.append(f"{root.rstrip('/')}/{ATTIC}/{stamp}")
    if not where:
        return []
    return [
        Finding.of(
            "C113",
            f"started over on purpose (--fresh): the previous run was moved to {', '.join(where)}",
            where=where[0],
            data={"moved_to": where},
        )
    ]


def schedule_to_resume(
    recipe: Recipe, step: int | None, saved: list[dict[str, Any]] | None, meta: dict[str, Any]
) -> tuple[LrSchedule, list[Finding]]:
    """The LR schedule of a run resuming at checkpoint `step` (the recipe's cosine on a fresh
    start, `step` None) and R620 when train.max_steps changed since that checkpoint;
    ConfigError (exit 2) when it is below the checkpoint's step. `saved`: the checkpoint's
    segments (None before they were saved: then the recipe in its manifest's `meta` gives the
    plan)."""
    t = recipe.train
    if step is None:
        return LrSchedule.planned(t.warmup_steps, t.min_lr_ratio, t.max_steps), []
    planned = None if saved else _checkpoint_max_steps(meta)
    return resumed_schedule(t, step, saved, planned)


def _checkpoint_max_steps(meta: dict[str, Any]) -> int | None:
    """train.max_steps of the recipe a checkpoint was written with (its manifest's `meta`,
    carried over from recipe.yaml by the converter for steps written before schedules were
    saved); None when it is not there: the plan is then taken to be the current max_steps."""
    try:
        value = meta["recipe"]["train"]["max_steps"]
    except (KeyError, TypeError):
        return None
    return value if type(value) is int and value >= 1 else None
