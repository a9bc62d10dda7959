"""fsspec URLs: the filesystem behind a URL (checkpoint roots, prepared data), with the object
store client's own retries switched off so that every retry is trainguard's and counted."""

from __future__ import annotations

from typing import Any

from trainguard.errors import BadInputError

# Extras to name when a URL needs a backend that is not installed.
_EXTRAS = {"s3": "trainguard[s3]", "s3a": "trainguard[s3]"}


def open_filesystem(
    url: str, storage_options: dict[str, Any] | None, what: str = "checkpoint root"
) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for `url` (`what` names it in messages);
    BadInputError naming a missing backend."""
    import fsspec  # imported here: local checkpoints never need it

    protocol = url.split("://", 1)[0]
    options = _without_client_retries(protocol, storage_options or {})
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as e:
        extra = _EXTRAS.get(protocol)
        how = f"pip install {extra}" if extra else f"install the fsspec backend for {protocol}://"
        raise BadInputError(
            f"{what} {url} needs a storage backend that is not installed: {e}",
            f"{how} (see fsspec's list of implementations)",
        ) from e
    except ValueError as e:  # unknown protocol
        raise BadInputError(
            f"{what} {url}: {e}",
            "use a local path, file://..., or an fsspec URL such as s3://bucket/prefix",
        ) from e
    if protocol in _S3:
        # s3fs's own retry loop is a class attribute (5 tries), not a constructor option:
        # `retries` in storage_options sets it; by default one try, so the retries are ours.
        fs.retries = int((storage_options or {}).get("retries", 1))
    return fs, path.rstrip("/")


_S3 = {"s3", "s3a"}


def _without_client_retries(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """Options that switch off the object store client's own retries, unless the caller set them.

    A `retries` key in the options is s3fs's try count (set on the instance by the caller). Our
    retries (retry.py) back off with full jitter, are staggered by rank, and are counted
    (C203): a client that silently retries underneath would hide the count and multiply the
    requests an overloaded store sees (botocore retries 5xx and SlowDown 4 times by default,
    s3fs wraps every call in 5 more tries)."""
    if protocol not in _S3:
        return options
    options = {k: v for k, v in options.items() if k != "retries"}
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
    return {**options, "config_kwargs": config}
