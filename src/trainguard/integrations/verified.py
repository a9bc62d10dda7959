"""Verified checkpoint folders for the framework adapters.

A Hugging Face `checkpoint-N` folder or a Lightning `step-N` folder gets, right after the
framework has written it, the manifest trainguard's own checkpoints carry
(`checkpoint/manifest.py`: every file's size and xxh3-128 checksum, the manifest's own
checksum). The manifest is written last, atomically: a folder without one was never finished
(a crash mid-save) and is never resumed from. On resume, the newest folder that verifies is
used; every newer one is reported (C101-C105) and moved to `<root>/quarantine/` (the evidence
is kept, never deleted, and the framework's own scans and rotation no longer see it; C112),
as trainguard's own checkpoint store does. The frameworks' retention (Lightning's top-k, the
Trainer's `save_total_limit`) goes through `quarantine_if_invalid` first: a folder it was about
to delete that fails verification is moved to `quarantine/` instead.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.checkpoint.folder import inspect_local_folder
from trainguard.checkpoint.local import QUARANTINE, fsync_tree
from trainguard.checkpoint.manifest import MANIFEST, build_manifest, manifest_bytes
from trainguard.findings import Finding, has_errors
from trainguard.util.atomic import atomic_write_bytes
from trainguard.util.nofollow import move_within


def commit_folder(folder: str | Path, step: int, meta: dict[str, Any] | None = None) -> None:
    """Write the manifest of a folder the framework has finished writing (the commit marker).

    The payload is synced first (frameworks do not), so a manifest on disk never describes
    files that a power cut could still take away."""
    folder = Path(folder)
    fsync_tree(folder)
    atomic_write_bytes(folder / MANIFEST, manifest_bytes(build_manifest(folder, step, meta)))


def step_folders(root: str | Path, prefix: str) -> dict[int, Path]:
    """{N: root/<prefix>N} for the folders named exactly `<prefix><decimal N>`."""
    pattern = re.compile(re.escape(prefix) + r"(0|[1-9][0-9]*)")
    found: dict[int, Path] = {}
    try:
        entries = list(Path(root).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if m and entry.is_dir() and not entry.is_symlink():
            found[int(m.group(1))] = entry
    return found


@dataclass
class Verified:
    """The newest folder that verifies (None if none does), and the newer ones that did not
    (`rejected`: each with the findings that say why, also gathered in `findings`)."""

    folder: Path | None = None
    step: int | None = None
    findings: list[Finding] = field(default_factory=list)
    rejected: dict[Path, list[Finding]] = field(default_factory=dict)


def verify_folder(folder: str | Path, step: int) -> list[Finding]:
    """The manifest, every file's size and checksum, and nothing else in the folder; [] when
    the folder verifies."""
    folder = Path(folder)
    manifest, findings = inspect_local_folder(folder, step, full=True)
    if manifest is None or has_errors(findings):
        return findings
    return findings + unlisted_entries(folder, step, manifest["files"])


def unlisted_entries(folder: Path, step: int, listed: dict[str, Any]) -> list[Finding]:
    """The framework reads its folder by itself (the Trainer whatever files it finds there,
    Lightning the .ckpt), never through the manifest: so every entry must be a regular file
    the manifest lists. C109 for a link, FIFO, device or socket (a read could leave the
    folder or block forever), C111 for a file the manifest does not list (it would be read
    unverified). Links are never followed."""
    found = []
    pending = [folder]
    while pending:
        here = pending.pop()
        with os.scandir(here) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                name = Path(entry.path).relative_to(folder).as_posix()
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif not entry.is_file(follow_symlinks=False):
                    mode = entry.stat(follow_symlinks=False).st_mode
                    kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                    found.append(_entry_finding("C109", step, folder, name, f"is {kind}"))
                elif name != MANIFEST and name not in listed:
                    found.append(
                        _entry_finding("C111", step, folder, name, "is not listed in its manifest")
                    )
    return found


def _entry_finding(code: str, step: int, folder: Path, name: str, what: str) -> Finding:
    return Finding.of(
        code,
        f"checkpoint step {step}: {name} {what}; the framework would read it unverified, so "
        f"{folder.name} is not resumed from",
        step=step,
        where=str(folder / name),
        data={"file": name, "reason": what},
    )


def newest_verified(root: str | Path, prefix: str, at_most: int | None = None) -> Verified:
    """Scan `root`'s `<prefix>N` folders (N <= `at_most`) from the newest; stop at the first
    that verifies. Read-only: one process of the job then calls `quarantine_rejected`."""
    out = Verified()
    folders = step_folders(root, prefix)
    for step in sorted((s for s in folders if at_most is None or s <= at_most), reverse=True):
        problems = verify_folder(folders[step], step)
        if not problems:
            out.folder, out.step = folders[step], step
            return out
        out.findings += problems
        out.rejected[folders[step]] = problems
    return out


def quarantine_rejected(verified: Verified) -> list[Finding]:
    """Move each rejected folder to `<its root>/quarantine/<name>` (`.1`, ... if taken); one
    C112 finding each. Nothing is deleted."""
    moved = []
    for folder, problems in verified.rejected.items():
        # Never out of the root: a linked quarantine/ is refused (LinkRefused), not followed.
        target = move_within(folder.parent, folder.name, f"{QUARANTINE}/{folder.name}")
        why = "; ".join(f.message for f in problems if f.severity == "error") or "invalid"
        moved.append(
            Finding.of(
                "C112",
                f"{folder.name} failed verification ({why}); moved to {target} instead of "
                "deleting it",
                step=problems[0].step if problems else None,
                where=str(target),
                data={"problems": [f.code for f in problems if f.severity == "error"]},
            )
        )
    return moved


def quarantine_if_invalid(folder: str | Path, step: int) -> list[Finding]:
    """Before retention deletes `folder`: verify it; if it fails, move it to quarantine/ and
    return why (its findings and C112): the caller must not delete it. [] when it verifies (the
    caller deletes it as usual). Call it from one process of the job."""
    problems = verify_folder(folder, step)
    return quarantine_folder(folder, problems) if problems else []


def quarantine_folder(folder: str | Path, problems: list[Finding]) -> list[Finding]:
    """Move `folder`, which failed verification with `problems`, to quarantine/; the problems
    and its C112. Call it from one process of the job."""
    return problems + quarantine_rejected(Verified(rejected={Path(folder): problems}))
