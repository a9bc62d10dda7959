"""The checkpoints a run record points at, each verified in full (checksums included), for the
report: `trainguard run`'s root (its recipe's checkpoint.dir), a `Checkpointer`'s, a Hugging
Face output_dir's `checkpoint-N` folders, a Lightning `VerifiedModelCheckpoint`'s `step-N`;
what was moved to `quarantine/` is listed as quarantined. Never raises on what is in there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.checkpoint.folder import inspect_local_folder
from trainguard.checkpoint.local import QUARANTINE, scan_root
from trainguard.checkpoint.manifest import step_dirname
from trainguard.checkpoint.target import run_checkpoint_root
from trainguard.metrics.record_read import RunRecord
from trainguard.util.paths import is_remote, local_path

HF_PREFIX = "checkpoint-"  # the Trainer's folders (integrations/hf_checkpoints.PREFIX)


def checkpoint_root(record: RunRecord) -> tuple[str, str]:
    """(root, layout) of the record's checkpoints: run.json's, else `trainguard run`'s."""
    given = record.checkpoints
    if given is None:
        return run_checkpoint_root(record.run_dir), "checkpointer"
    root = given["root"]
    if not is_remote(root) and not Path(local_path(root)).is_absolute():
        root = str(record.run_dir / local_path(root))  # written relative to the run dir
    return root, str(given.get("layout") or "checkpointer")


def _row(folder: Path, step: int) -> dict[str, Any]:
    manifest, findings = inspect_local_folder(folder, step)
    errors = [f for f in findings if f.severity == "error"]
    size = sum(e["size"] for e in manifest["files"].values()) if manifest else 0
    return {
        "step": step,
        "path": str(folder),
        "bytes": size,
        "valid": not errors,
        "status": "verified" if not errors else "INVALID",
        "problem": "; ".join(f"{f.code} {f.message}" for f in errors),
    }


def _numbered(root: Path, prefix: str) -> dict[int, Path]:
    out = {}
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        digits = entry.name[len(prefix) :]
        canonical = digits.isascii() and digits.isdigit() and digits == str(int(digits))
        if (
            entry.name.startswith(prefix)
            and canonical
            and entry.is_dir()
            and not entry.is_symlink()
        ):
            out[int(digits)] = entry
    return out


def list_checkpoints(record: RunRecord) -> list[dict[str, Any]]:
    """Every checkpoint of the record, oldest first, then the quarantined ones."""
    root, layout = checkpoint_root(record)
    if is_remote(root):
        return []  # an object store: listing it is `trainguard eval`'s job, not the report's
    root_path = Path(local_path(root))
    rows = []
    if layout == "hf":  # the output_dir holds other files too: only checkpoint-N folders
        rows = [_row(folder, step) for step, folder in _numbered(root_path, HF_PREFIX).items()]
    else:
        steps, ignored = scan_root(root_path)
        rows = [_row(root_path / step_dirname(s), s) for s in sorted(steps)]
        rows += [
            {
                "step": name,
                "path": str(root_path / name),
                "bytes": 0,
                "valid": False,
                "status": "ignored",
                "problem": f"C110 ignored, not a checkpoint: {why}",
            }
            for name, why in ignored
        ]
    quarantine = root_path / QUARANTINE
    for entry in sorted(quarantine.iterdir()) if quarantine.is_dir() else []:
        rows.append(
            {
                "step": entry.name,
                "path": str(entry),
                "bytes": 0,
                "valid": False,
                "status": "quarantined",
                "problem": "failed verification and was moved to quarantine/ (kept as evidence)",
            }
        )
    return rows
