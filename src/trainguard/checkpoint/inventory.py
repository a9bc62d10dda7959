"""Findings about a checkpoint root beyond the checksums: entries that are not checkpoints
(C110, warned once each); when no step can be used, every step with its problems (C107), so
nobody has to guess why a run refuses to start over; a step that verifies but does not load
(C111)."""

from __future__ import annotations

import pickle
from pathlib import Path

from trainguard.findings import Finding


def junk_findings(root: str, ignored: list[tuple[str, str]], warned: set[str]) -> list[Finding]:
    """C110 for each (name, reason) not in `warned` yet; `warned` is updated."""
    out = []
    for name, why in ignored:
        if name in warned:
            continue
        warned.add(name)
        out.append(
            Finding.of(
                "C110",
                f"ignored {name!r} in the checkpoint folder {root}: {why}",
                where=f"{root.rstrip('/')}/{name}",
                data={"name": name, "reason": why},
            )
        )
    return out


def none_usable(root: str, located: dict[int, str], findings: list[Finding]) -> Finding:
    """C107 naming every step in `located` ({step: location}) and its error findings."""
    listing, parts = [], []
    for step, location in sorted(located.items()):
        problems = [f for f in findings if f.step == step and f.severity == "error"]
        listing.append(
            {
                "step": step,
                "location": location,
                "problems": [
                    {"code": f.code, "file": f.data.get("file"), "message": f.message}
                    for f in problems
                ],
            }
        )
        prefix = f"checkpoint step {step}: "
        said = ", ".join(f"{f.message.removeprefix(prefix)} ({f.code})" for f in problems)
        parts.append(f"step {step}: {said or 'invalid'}")
    return Finding.of(
        "C107",
        f"none of the {len(located)} checkpoints under {root} can be used: " + "; ".join(parts),
        where=root,
        data={"root": root, "checkpoints": listing},
    )


def load_error_words(exc: BaseException) -> str:
    """Why a file did not load, in one line, never passing on torch's advice to unpickle with
    `weights_only=False` (following it would run whatever code the file holds)."""
    text = str(exc).strip()
    if isinstance(exc, pickle.UnpicklingError) or "weights_only" in text:
        return "it holds pickled Python objects, and trainguard loads tensors only"
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def unloadable(step: int, folder: Path, file: str, why: str) -> Finding:
    """C111: a checkpoint that verifies but whose `file` does not load, and why."""
    return Finding.of(
        "C111",
        f"checkpoint step {step}: {file} cannot be loaded: {why}",
        step=step,
        where=str(folder / file),
        data={"file": file, "reason": why},
    )
