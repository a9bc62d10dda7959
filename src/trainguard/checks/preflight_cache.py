"""Pre-flight results kept in the run dir, so that a resume re-runs only the checks whose inputs
changed (restarting a run should not pay for seconds of checks that cannot have changed).

`RUN_DIR/preflight_cache.json` is data (JSON, never pickle):

    {"version": 1, "checksum": "<xxh3-128 of the entries' canonical JSON>",
     "entries": {"<check>": {"key": "<16 hex>", "findings": [Finding.to_dict(), ...],
                             "details": {...}}}}

A check's key hashes its name, its inputs (what the caller says the check reads: the recipe,
the data's fingerprint, eval spec files) and the code version (trainguard's own source and the
versions of Python, torch and tokenizers): a change in any of them runs the check again. The
file is the run's own output, trusted as its checkpoints are (the checksum catches damage, not
forgery: docs/architecture.md). A file that fails to parse or verify is set aside as
`preflight_cache.json.damaged-<ns>` (never deleted) and every check runs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainguard.findings import Finding
from trainguard.util.atomic import atomic_write_text
from trainguard.util.hashing import bytes_checksum, stable_json_hash

CACHE_FILE = "preflight_cache.json"
VERSION = 1

CheckFn = Callable[[], tuple[list[Finding], dict[str, Any]]]


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """16 hex digits that change when trainguard's source or the libraries the checks compute
    with change. Hashing the package's .py files costs milliseconds; a version string alone
    would miss every edit made between releases."""
    import tokenizers
    import torch

    import trainguard

    root = Path(trainguard.__file__).parent
    h = [trainguard.__version__, sys.version, torch.__version__, tokenizers.__version__]
    for path in sorted(root.rglob("*.py")):
        h.append(path.relative_to(root).as_posix())
        h.append(bytes_checksum(path.read_bytes()))
    return stable_json_hash(h)


def _canonical(entries: dict[str, Any]) -> bytes:
    return json.dumps(entries, sort_keys=True, separators=(",", ":"), default=str).encode()


def _valid_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("key"), str)
        and isinstance(entry.get("findings"), list)
        and all(isinstance(f, dict) for f in entry["findings"])
        and isinstance(entry.get("details"), dict)
    )


class PreflightCache:
    """The cached results of one run dir's pre-flight checks (`load`, `run`, `save`)."""

    def __init__(self, path: Path, entries: dict[str, dict[str, Any]] | None = None) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = entries or {}
        self.changed = False

    @classmethod
    def load(cls, run_dir: str | Path) -> PreflightCache:
        """The run dir's cache; empty when there is none, or when it is damaged (set aside)."""
        path = Path(run_dir) / CACHE_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(path)
        except (OSError, UnicodeDecodeError, ValueError):
            return cls._set_aside(path)
        entries = raw.get("entries") if isinstance(raw, dict) else None
        if (
            not isinstance(entries, dict)
            or raw.get("version") != VERSION
            or raw.get("checksum") != bytes_checksum(_canonical(entries))
            or not all(_valid_entry(e) for e in entries.values())
        ):
            return cls._set_aside(path)
        return cls(path, entries)

    @classmethod
    def _set_aside(cls, path: Path) -> PreflightCache:
        cache = cls(path)
        # Unreadable and immovable: the next save replaces it (if the folder takes writes).
        with contextlib.suppress(OSError):
            os.replace(path, path.with_name(f"{path.name}.damaged-{time.time_ns()}"))
        cache.changed = True
        return cache

    @staticmethod
    def key(name: str, inputs: Mapping[str, Any]) -> str:
        return stable_json_hash({"check": name, "inputs": inputs, "code": code_version()})

    def get(self, name: str, inputs: Mapping[str, Any]) -> tuple[list[Finding], dict] | None:
        """The check's findings and details when it ran before on the same inputs, else None."""
        entry = self.entries.get(name)
        if entry is None or entry["key"] != self.key(name, inputs):
            return None
        try:
            findings = [Finding.from_dict(f) for f in entry["findings"]]
        except (TypeError, ValueError):  # e.g. an unknown severity: run the check again
            return None
        return findings, dict(entry["details"])

    def put(
        self, name: str, inputs: Mapping[str, Any], findings: list[Finding], details: dict
    ) -> None:
        # Stored as it reads back (JSON), so a cached result equals a fresh one's log row.
        entry = {
            "key": self.key(name, inputs),
            "findings": [f.to_dict() for f in findings],
            "details": details,
        }
        self.entries[name] = json.loads(_canonical(entry))
        self.changed = True

    def save(self) -> None:
        """Write the cache atomically when something changed (OutputWriteError on failure)."""
        if not self.changed:
            return
        body = {
            "version": VERSION,
            "checksum": bytes_checksum(_canonical(self.entries)),
            "entries": self.entries,
        }
        atomic_write_text(self.path, json.dumps(body, indent=1, sort_keys=True, default=str))
        self.changed = False

    def run(
        self, checks: Mapping[str, tuple[CheckFn, Mapping[str, Any] | None]]
    ) -> tuple[list[Finding], dict[str, dict]]:
        """Run each check (name -> (function, inputs)) unless its result for the same inputs is
        cached; inputs None: never cached. Returns all findings and, per check, its details
        with `seconds` (spent now), `findings` (count) and `cached` (true when not run)."""
        findings: list[Finding] = []
        details: dict[str, dict] = {}
        for name, (check, inputs) in checks.items():
            t0 = time.perf_counter()
            hit = self.get(name, inputs) if inputs is not None else None
            if hit is None:
                found, info = check()
                if inputs is not None:
                    self.put(name, inputs, found, info)
            else:
                found, info = hit
            seconds = time.perf_counter() - t0
            details[name] = {
                **info,
                "seconds": seconds,
                "findings": len(found),
                "cached": hit is not None,
            }
            findings += found
        return findings, details
