"""Checksums and fingerprints. xxh3-128 for speed on large files; hex strings everywhere."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import xxhash

CHUNK = 1 << 20


def file_checksum(path: str | Path) -> str:
    """xxh3-128 of a file's bytes, read in 1 MiB chunks."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def bytes_checksum(data: bytes | memoryview) -> str:
    return xxhash.xxh3_128(data).hexdigest()


def stable_json_hash(obj: Any) -> str:
    """A hash of a JSON-able object that does not depend on dict order."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stable_u64(text: str) -> int:
    """A 64-bit hash of a string that is the same on every machine and Python run."""
    return xxhash.xxh64_intdigest(text.encode("utf-8"))
