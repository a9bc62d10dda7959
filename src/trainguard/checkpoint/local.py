"""Checkpoints in a local (or NFS-mounted) folder: write to a temp folder, fsync, rename.

The crash-consistency recipe of Pillai et al. (OSDI 2014): payload files are written and
fsynced, the manifest is written and fsynced last, the temp folder is fsynced, renamed to
`step-<N>` in one `rename(2)` and the parent folder is fsynced. A reader therefore sees either
no `step-<N>` or a complete one; a killed writer leaves only a `.tmp-step-*` folder, which no
reader matches and the next save or open removes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.checkpoint.manifest import (
    MANIFEST,
    manifest_bytes,
    parse_step_dirname,
    payload_files,
    step_dirname,
    verify_local_folder,
)
from trainguard.errors import StorageError
from trainguard.findings import Finding
from trainguard.util.atomic import fsync_dir

TMP_PREFIX = ".tmp-step-"
TRASH_PREFIX = ".trash-step-"
# A temp folder of a live process is left alone unless it is this old (a pid reused after a
# reboot, or a writer on another host of a shared file system).
STALE_AFTER_S = 24 * 3600.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            if pid > 0 and pid != os.getpid() and _pid_alive(pid) and age < STALE_AFTER_S:
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under `folder` (the folder itself last)."""
    for dirpath, _dirs, files in os.walk(folder, topdown=False):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def write_manifest(folder: Path, manifest: dict[str, Any], sync: bool = True) -> None:
    with open(folder / MANIFEST, "wb") as f:
        f.write(manifest_bytes(manifest))
        if sync:
            f.flush()
            os.fsync(f.fileno())


def new_temp_dir(parent: Path, step: int) -> Path:
    tmp = parent / f"{TMP_PREFIX}{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def install(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`, replacing an existing `final` (a step saved again)."""
    trash = None
    if final.exists():
        trash = final.with_name(f"{TRASH_PREFIX}{parse_step_dirname(final.name)}-{os.getpid()}")
        if trash.exists():
            shutil.rmtree(trash)
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
    trash = folder.with_name(f"{TRASH_PREFIX}{parse_step_dirname(folder.name)}-{os.getpid()}")
    if trash.exists():
        shutil.rmtree(trash)
    os.rename(folder, trash)
    fsync_dir(folder.parent)
    shutil.rmtree(trash, ignore_errors=True)


class LocalBackend:
    """Step folders directly under a local root."""

    remote = False

    def __init__(self, root: Path, on_phase: Callable[[str, int], None] | None = None) -> None:
        self.root = root
        self.on_phase = on_phase
        if root.exists() and not root.is_dir():
            raise StorageError(
                f"checkpoint root {root} exists but is not a folder",
                "point checkpoint.dir at a folder, not a file",
            )
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(
                f"cannot create checkpoint folder {root}: {e.strerror or e}",
                "point checkpoint.dir at a writable folder (every parent must be a folder)",
            ) from e
        clean_stale_temps(root)

    def location(self, step: int) -> str:
        return str(self.root / step_dirname(step))

    def step_folders(self) -> dict[int, bool]:
        """{step: has a manifest} for every `step-<N>` folder."""
        out: dict[int, bool] = {}
        if not self.root.is_dir():
            return out
        for entry in self.root.iterdir():
            step = parse_step_dirname(entry.name)
            if step is not None and entry.is_dir():
                out[step] = (entry / MANIFEST).is_file()
        return out

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
