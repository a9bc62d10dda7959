"""The checkpoint manifest: the commit marker, written last, that says what a complete step holds.

`manifest.json` lists every payload file with its size and xxh3-128 checksum, and carries a
checksum of its own content, so a truncated or hand-edited manifest is caught as surely as a
damaged payload file. The self-checksum is integrity, not authenticity: whoever can write the
folder can write a manifest that matches. So a manifest is untrusted data: every name in it
must be a plain relative path inside its step folder (`entry_problem`), checked before any
file is opened, downloaded or written, on every backend. Verification is written once against
two small callables (size of a file, checksum of at most that many bytes) so the local folder
and the object store share it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainguard.findings import Finding
from trainguard.util.hashing import bytes_checksum, file_checksum

MANIFEST = "manifest.json"
FORMAT = "trainguard-checkpoint/1"
STEP_PREFIX = "step-"


def step_dirname(step: int) -> str:
    return f"{STEP_PREFIX}{step}"


def parse_step_dirname(name: str) -> int | None:
    """N for the canonical `step-N` (ASCII digits, no leading zero), None for anything else:
    `step-0020` or `step-20.bak` never stand in for step 20, temp folders never match."""
    if not name.startswith(STEP_PREFIX):
        return None
    digits = name[len(STEP_PREFIX) :]
    if not (digits.isascii() and digits.isdigit()):
        return None
    return int(digits) if step_dirname(int(digits)) == name else None


class UnsafeEntry(Exception):
    """A payload file that must not be read: a symlink, a device, a FIFO, a folder."""


def entry_problem(name: object) -> str | None:
    """Why a manifest file name is not a plain relative path inside its step folder, or None.

    The one containment rule for every backend: no absolute path, no `..` (nor `.` or empty)
    component, no backslash or control character, and never the manifest itself.
    """
    if not isinstance(name, str) or not name:
        return "an empty or non-text name"
    if name.startswith("/"):
        return "an absolute path"
    if any(ord(c) < 32 or c == "\\" for c in name):
        return "a backslash or control character"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "a '..', '.' or empty path component"
    if name == MANIFEST:
        return "the manifest's own name"
    return None


def _entry_ok(entry: object) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("checksum"), str):
        return False
    size = entry.get("size")
    return isinstance(size, int) and not isinstance(size, bool) and size >= 0


def _self_checksum(body: dict[str, Any]) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return bytes_checksum(text.encode("utf-8"))


def payload_files(folder: Path) -> list[str]:
    """Relative POSIX names of every regular file under `folder`, sorted (manifest excluded)."""
    names = []
    for dirpath, _dirs, files in os.walk(folder):
        for f in files:
            rel = Path(dirpath, f).relative_to(folder).as_posix()
            if rel != MANIFEST:
                names.append(rel)
    return sorted(names)


def build_manifest(
    folder: Path | None,
    step: int,
    meta: dict[str, Any] | None = None,
    files: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Sizes and checksums of the payload files in `folder`, plus the manifest's own checksum.

    `files` ({name: {"size", "checksum"}}) replaces reading `folder` when the files were
    checksummed by the processes that wrote them (a sharded save: each rank its own)."""
    if files is None:
        assert folder is not None
        files = {
            name: {"size": (folder / name).stat().st_size, "checksum": file_checksum(folder / name)}
            for name in payload_files(folder)
        }
    body = {
        "format": FORMAT,
        "step": int(step),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "checksum_algo": "xxh3_128",
        "files": dict(sorted(files.items())),
        "meta": meta or {},
    }
    return {**body, "manifest_checksum": _self_checksum(body)}


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8")


def parse_manifest(
    raw: bytes | None, step: int, where: str
) -> tuple[dict[str, Any] | None, list[Finding]]:
    """The manifest if it is complete, unedited and names `step`; else None and the findings."""

    def bad(code: str, why: str) -> tuple[None, list[Finding]]:
        return None, [Finding.of(code, f"checkpoint step {step}: {why}", step=step, where=where)]

    if raw is None:
        return bad("C104", f"{MANIFEST} is missing, so the step was never committed")
    try:
        m = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return bad("C104", f"{MANIFEST} is not valid JSON (truncated?): {e}")
    required = ("format", "step", "files", "manifest_checksum")
    if not isinstance(m, dict) or any(k not in m for k in required):
        return bad("C104", f"{MANIFEST} lacks required fields {list(required)}")
    if m["format"] != FORMAT:
        return bad("C104", f"{MANIFEST} has format {m['format']!r}, expected {FORMAT!r}")
    body = {k: v for k, v in m.items() if k != "manifest_checksum"}
    actual = _self_checksum(body)
    if actual != m["manifest_checksum"]:
        return bad(
            "C104",
            f"{MANIFEST} was edited after it was written (its self-checksum is "
            f"{m['manifest_checksum']}, its content hashes to {actual})",
        )
    files = m["files"]
    if not isinstance(files, dict) or not all(_entry_ok(v) for v in files.values()):
        return bad("C104", f"{MANIFEST} has a malformed `files` table")
    for name in sorted(files):
        why = entry_problem(name)
        if why is not None:  # nothing of this step is read, downloaded or written
            return None, [
                Finding.of(
                    "C108",
                    f"checkpoint step {step}: {MANIFEST} lists {name!r}, {why}; every file "
                    "must be a plain relative path inside its step folder, so nothing of this "
                    "step was read",
                    step=step,
                    where=where,
                    data={"file": name, "problem": why},
                )
            ]
    if m["step"] != step:
        return None, [
            Finding.of(
                "C105",
                f"folder of step {step} holds the manifest of step {m['step']}",
                step=step,
                where=where,
                data={"folder_step": step, "manifest_step": m["step"]},
            )
        ]
    return m, []


def check_files(
    manifest: dict[str, Any],
    size_of: Callable[[str], int | None],
    checksum_of: Callable[[str, int], str] | None,
    where: str,
) -> list[Finding]:
    """Findings for missing, wrong-size, unreadable and (if `checksum_of` is given) corrupt files.

    `size_of(name)` returns None for a missing file and raises UnsafeEntry for one that must
    not be read. `checksum_of(name, size)` reads at most `size` bytes (the manifest's size).
    Checksums are only computed for files whose size is right: a wrong size already proves the
    file damaged.
    """
    step = manifest["step"]
    findings = []
    for name, entry in sorted(manifest["files"].items()):
        try:
            size = size_of(name)
        except UnsafeEntry as e:
            findings.append(
                Finding.of(
                    "C109",
                    f"checkpoint step {step}: {name} is {e}, not a regular file inside the "
                    "step folder; it was not read",
                    step=step,
                    where=f"{where}/{name}",
                    data={"file": name, "kind": str(e)},
                )
            )
            continue
        if size is None:
            findings.append(
                Finding.of(
                    "C103",
                    f"checkpoint step {step}: {name} is listed in the manifest but missing",
                    step=step,
                    where=f"{where}/{name}",
                    data={"file": name},
                )
            )
        elif size != entry["size"]:
            findings.append(
                Finding.of(
                    "C102",
                    f"checkpoint step {step}: {name} is corrupt: size {size} bytes, "
                    f"manifest says {entry['size']}",
                    step=step,
                    where=f"{where}/{name}",
                    data={"file": name, "expected_size": entry["size"], "actual_size": size},
                )
            )
        elif checksum_of is not None:
            actual = checksum_of(name, entry["size"])
            if actual != entry["checksum"]:
                findings.append(
                    Finding.of(
                        "C101",
                        f"checkpoint step {step}: {name} is corrupt: checksum {actual}, "
                        f"expected {entry['checksum']}",
                        step=step,
                        where=f"{where}/{name}",
                        data={
                            "file": name,
                            "expected_checksum": entry["checksum"],
                            "actual_checksum": actual,
                        },
                    )
                )
    return findings
