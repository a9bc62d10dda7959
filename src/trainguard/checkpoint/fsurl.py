"""fsspec URLs for checkpoint roots: the filesystem behind a URL and the local cache folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainguard.errors import BadInputError
from trainguard.util.hashing import stable_u64

# Extras to name when a URL needs a backend that is not installed.
_EXTRAS = {"s3": "trainguard[s3]", "s3a": "trainguard[s3]"}


def open_filesystem(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for `url`; BadInputError naming a missing backend."""
    import fsspec  # imported here: local checkpoints never need it

    protocol = url.split("://", 1)[0]
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as e:
        extra = _EXTRAS.get(protocol)
        how = f"pip install {extra}" if extra else f"install the fsspec backend for {protocol}://"
        raise BadInputError(
            f"checkpoint root {url} needs a storage backend that is not installed: {e}",
            f"{how} (see fsspec's list of implementations)",
        ) from e
    except ValueError as e:  # unknown protocol
        raise BadInputError(
            f"checkpoint root {url}: {e}",
            "use a local path, file://..., or an fsspec URL such as s3://bucket/prefix",
        ) from e
    return fs, path.rstrip("/")


def default_cache_dir(url: str) -> Path:
    base = os.environ.get("TRAINGUARD_CACHE") or os.path.join("~", ".cache", "trainguard")
    return Path(base).expanduser() / "checkpoints" / f"{stable_u64(url):016x}"
