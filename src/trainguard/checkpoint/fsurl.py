"""The local cache folder of a checkpoint root URL (the filesystem behind a URL is
`util/fsurl.py`)."""

from __future__ import annotations

import os
from pathlib import Path

from trainguard.util.hashing import stable_u64


def default_cache_dir(url: str) -> Path:
    base = os.environ.get("TRAINGUARD_CACHE") or os.path.join("~", ".cache", "trainguard")
    return Path(base).expanduser() / "checkpoints" / f"{stable_u64(url):016x}"
