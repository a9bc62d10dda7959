"""Checkpoints in a local (or NFS-mounted) folder: write to a temp folder, fsync, rename.

The crash-consistency recipe of Pillai et al. (OSDI 2014): payload files are written and
fsynced, the manifest is written and fsynced last, the temp folder is fsynced, renamed to
`step-<N>` in one `rename(2)` and the parent folder is fsynced. A reader therefore sees either
no `step-<N>` or a complete one; a killed writer leaves only a `.tmp-step-*` folder, which no
reader matches and the next save or open removes. Temp and trash folders get unpredictable
names (mkdtemp), so a symlink planted under a guessable name is never followed.

Nothing that failed verification is deleted: `move_aside` renames a step folder into
`quarantine/` (or `attic/<label>/` for `trainguard run --fresh`), which no scan looks into.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.checkpoint.folder import verify_local_folder
from trainguard.checkpoint.manifest import (
    MANIFEST,
    STEP_PREFIX,
    manifest_bytes,
    parse_step_dirname,
    payload_files,
    step_dirname,
)
from trainguard.errors import StorageError
from trainguard.findings import Finding
from trainguard.util.atomic import fsync_dir, make_temp_dir
from trainguard.util.nofollow import move_within
from trainguard.util.processes import pid_alive

TMP_PREFIX = ".tmp-step-"
TRASH_PREFIX = ".trash-step-"
# Folders in a checkpoint root that hold steps set aside; never scanned, never warned about.
QUARANTINE = "quarantine"
ATTIC = "attic"
SET_ASIDE = (QUARANTINE, ATTIC)
# A temp folder of a live process is left alone unless it is this old (a pid reused after a
# reboot, or a writer on another host of a shared file system).
STALE_AFTER_S = 24 * 3600.0


def clean_stale_temps(folder: Path) -> list[Path]:
    """Remove `.tmp-step-*-<pid>` / `.trash-step-*-<pid>` folders whose writer is gone."""
    removed = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in folder.iterdir():
            if not entry.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
                continue
            pid_text = entry.name.rsplit("-", 1)[-1]
            pid = int(pid_text) if pid_text.isdigit() else -1
            try:
                age = time.time() - entry.stat().st_mtime
            except FileNotFoundError:
                continue
            if pid == os.getpid() and age < STALE_AFTER_S:
                continue  # our own save in flight (save_async runs in a thread)
            if pid > 0 and pid != os.getpid() and pid_alive(pid) and age < STALE_AFTER_S:
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under `folder` (the folder itself last)."""
    for dirpath, _dirs, files in os.walk(folder, topdown=False):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def write_manifest(folder: Path, manifest: dict[str, Any], sync: bool = True) -> None:
    # A new file in our own fresh temp folder; O_EXCL|O_NOFOLLOW all the same: never follow.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(folder / MANIFEST, flags, 0o666), "wb") as f:
        f.write(manifest_bytes(manifest))
        if sync:
            f.flush()
            os.fsync(f.fileno())


def new_temp_dir(parent: Path, step: int) -> Path:
    """`.tmp-step-<N>-<random>-<pid>`: the pid last, for `clean_stale_temps`."""
    parent.mkdir(parents=True, exist_ok=True)
    return make_temp_dir(parent, f"{TMP_PREFIX}{step}-", f"-{os.getpid()}")


def _trash_dir(final: Path) -> Path:
    """An empty, unpredictably named folder next to `final` to rename it over (allowed for an
    empty target folder), so a half-deleted step never looks committed."""
    return make_temp_dir(
        final.parent, f"{TRASH_PREFIX}{parse_step_dirname(final.name)}-", f"-{os.getpid()}"
    )


def install(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`, replacing an existing `final` (a step saved again)."""
    trash = None
    if final.exists():
        trash = _trash_dir(final)
        os.rename(final, trash)
    try:
        os.rename(tmp, final)
    except OSError:
        if trash is not None:  # put the old step back rather than lose both
            os.rename(trash, final)
        raise
    fsync_dir(final.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def remove_step_folder(folder: Path) -> None:
    """Delete a step folder; renamed away first, so a half-deleted one never looks committed."""
    if not folder.exists():
        return
    trash = _trash_dir(folder)
    os.rename(folder, trash)
    fsync_dir(folder.parent)
    shutil.rmtree(trash, ignore_errors=True)


def free_path(path: Path) -> Path:
    """`path`, or `path.1`, `path.2`, ... whichever does not exist yet (nothing is replaced)."""
    candidate, n = path, 0
    while os.path.lexists(candidate):
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def scan_root(root: Path) -> tuple[dict[int, bool], list[tuple[str, str]]]:
    """({step: has a manifest} for every canonical `step-<N>` folder, [(name, why it is not a
    checkpoint)] for every other entry); temp folders and the set-aside folders are skipped."""
    steps: dict[int, bool] = {}
    ignored: list[tuple[str, str]] = []
    if not root.is_dir():
        return steps, ignored
    for entry in sorted(root.iterdir()):
        name = entry.name
        if name.startswith((TMP_PREFIX, TRASH_PREFIX)) or name in SET_ASIDE:
            continue
        step = parse_step_dirname(name)
        if step is not None and entry.is_dir() and not entry.is_symlink():
            steps[step] = (entry / MANIFEST).is_file()
        else:
            ignored.append((name, junk_reason(name, entry.is_symlink())))
    return steps, ignored


def junk_reason(name: str, is_link: bool = False) -> str:
    """Why an entry of a checkpoint root is not a checkpoint (shared with the object store)."""
    step = parse_step_dirname(name)
    if step is not None:
        return "a symbolic link, not a step folder" if is_link else "a file, not a step folder"
    digits = name[len(STEP_PREFIX) :] if name.startswith(STEP_PREFIX) else ""
    if digits.isascii() and digits.isdigit():
        return f"not the canonical name of step {int(digits)} ({step_dirname(int(digits))})"
    return "not a step-<N> folder"


class LocalBackend:
    """Step folders directly under a local root."""

    remote = False

    def __init__(self, root: Path, on_phase: Callable[[str, int], None] | None = None) -> None:
        self.root = root
        self.on_phase = on_phase
        self.ignored: list[tuple[str, str]] = []  # entries of the last scan that are not steps
        if root.exists() and not root.is_dir():
            raise StorageError(
                f"checkpoint root {root} exists but is not a folder",
                "point the checkpoints at a folder, not a file (checkpoint.dir in a `trainguard "
                "run` recipe, the Checkpointer's path in your own loop)",
            )
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(
                f"cannot create checkpoint folder {root}: {e.strerror or e}",
                "point the checkpoints at a writable folder, every parent a folder "
                "(checkpoint.dir in a `trainguard run` recipe, the Checkpointer's path in your "
                "own loop)",
            ) from e
        clean_stale_temps(root)

    def location(self, step: int) -> str:
        return str(self.root / step_dirname(step))

    def step_folders(self) -> dict[int, bool]:
        """{step: has a manifest} for every `step-<N>` folder; `ignored` lists the rest."""
        steps, self.ignored = scan_root(self.root)
        return steps

    def has_step(self, step: int) -> bool:
        return os.path.lexists(self.root / step_dirname(step))

    def move_aside(self, step: int, dest: str) -> str:
        """Rename step `step` to `<root>/<dest>` (or `<dest>.1`, ...); nothing is deleted, and
        nothing leaves the root: a linked quarantine/ or attic/ is refused (LinkRefused)."""
        return str(move_within(self.root, step_dirname(step), dest))

    def quick_status(self) -> dict[int, tuple[bool, bool]]:
        """{step: (committed, structurally valid)}: manifest intact, files present, sizes right."""
        return {
            s: (committed, committed and not self.verify(s, full=False))
            for s, committed in self.step_folders().items()
        }

    def new_stage(self, step: int) -> Path:
        clean_stale_temps(self.root)
        return new_temp_dir(self.root, step)

    def commit(self, step: int, stage: Path, manifest: dict[str, Any]) -> tuple[str, list[Finding]]:
        # The manifest is written last, but the commit point is the rename: syncing the whole
        # temp folder once (files, manifest, then the folder) before it is as safe as syncing
        # payload and manifest separately, with one fsync less.
        write_manifest(stage, manifest, sync=False)
        fsync_tree(stage)
        if self.on_phase is not None:
            self.on_phase("checkpoint_rename", step)
        install(stage, self.root / step_dirname(step))
        return self.location(step), []

    def verify(self, step: int, full: bool = True) -> list[Finding]:
        return verify_local_folder(self.root / step_dirname(step), step, full=full)

    def fetch(self, step: int) -> tuple[Path, list[Finding], bool]:
        folder = self.root / step_dirname(step)
        return folder, verify_local_folder(folder, step), False

    def abort(self, step: int) -> None:
        """Nothing to undo: a failed save never renamed its temp folder into place."""

    def delete(self, step: int) -> list[Finding]:
        remove_step_folder(self.root / step_dirname(step))
        return []


def staged_bytes(stage: Path) -> int:
    return sum((stage / n).stat().st_size for n in payload_files(stage))
