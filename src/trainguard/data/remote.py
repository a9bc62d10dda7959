"""Prepared data on an object store (`data.prepared: s3://bucket/prefix/KEY`, any fsspec URL),
fetched once per machine into the node cache (util/node_cache.py) and memory-mapped there.

The URL holds what `trainguard data prepare --out` wrote in its key folder (manifest.json,
tokenizer.json, the document indexes and the `.bin` shards). The small files are one cache
entry, fetched when the data is opened; each shard is an entry of its own, fetched the first
time a sample reads from it (on demand). Whichever process of the machine needs an entry first
fetches it while the others wait on the entry's lock, then every process memory-maps the same
file: N processes on a node cause one GET per shard. Every entry is checked against the
manifest (size and xxh3 checksum) when it is fetched and again when a later run (a resume)
finds it in the cache; a cached copy that fails is fetched again, nothing already verified is
downloaded twice. Entries in use are never evicted; `close()` releases them and trims the cache
to its size limit, least recently used first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.data import shards
from trainguard.errors import StorageError
from trainguard.util.fsurl import open_filesystem
from trainguard.util.node_cache import DEFAULT_MAX_BYTES, CacheEntry, NodeCache

# The files of a prepared folder other than the shards, relative to it.
_SPLIT_META = ("doc_index", "doc_labels")


class RemotePrepared:
    """A prepared data folder at `url`, read through the node cache at `cache_root`."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        cache_root: str | Path | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.url = url.rstrip("/")
        # Reads of immutable files: the client's own retries (botocore's standard mode, s3fs's
        # loop) are enough here, unless the options say otherwise.
        options = dict(storage_options or {})
        if self.url.split("://", 1)[0] in ("s3", "s3a"):
            options.setdefault("retries", 5)
            config = dict(options.get("config_kwargs") or {})
            config.setdefault("retries", {"total_max_attempts": 5, "mode": "standard"})
            options["config_kwargs"] = config
        self.fs, self.root = open_filesystem(self.url, options, what="prepared data")
        self.cache = NodeCache(cache_root, max_bytes)
        self._held: list[CacheEntry] = []
        self.manifest: dict[str, Any] = {}

    def _download(self, name: str, folder: Path) -> None:
        remote = f"{self.root}/{name}"
        try:
            self.fs.get_file(remote, str(folder / name))
        except FileNotFoundError:
            raise StorageError(
                f"prepared data {self.url} has no {name}",
                "point data.prepared at the key folder `trainguard data prepare --out` wrote "
                "(the one holding manifest.json), uploaded whole",
            ) from None
        except OSError as e:
            raise StorageError(
                f"cannot download {self.url}/{name}: {e}",
                "check the URL, the credentials (data.storage_options) and the network",
            ) from e

    def _fill_meta(self, folder: Path) -> None:
        self._download(shards.MANIFEST, folder)
        manifest, problems = shards.read_manifest(folder)
        shards.raise_if_corrupt(problems, Path(self.url))
        assert manifest is not None
        for name in self._meta_entries(manifest):
            self._download(name["file"], folder)

    @staticmethod
    def _meta_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
        splits = [manifest["splits"][s] for s in shards.SPLITS]
        return [manifest["tokenizer"]] + [m[k] for m in splits for k in _SPLIT_META]

    def open_meta(self) -> Path:
        """The verified folder of the manifest, tokenizer and document indexes."""
        entry = self.cache.get(f"{self.url}#meta", self._fill_meta)
        self._held.append(entry)
        manifest, problems = shards.read_manifest(entry.path)
        for e in self._meta_entries(manifest) if manifest else []:
            problems += shards._check_file(entry.path, e)
        shards.raise_if_corrupt(problems, Path(self.url))
        assert manifest is not None
        self.manifest = manifest
        return entry.path

    def shard_path(self, entry: dict[str, Any]) -> Path:
        """The node's verified copy of one shard (fetched now unless the cache holds it)."""
        name = entry["file"]
        want = {name: {"size": entry["size"], "checksum": entry["checksum"]}}
        cached = self.cache.get(
            f"{self.url}/{name}#{entry['checksum']}",
            lambda folder: self._download(name, folder),
            expect=want,
        )
        self._held.append(cached)
        return cached.path / name

    def close(self) -> None:
        """Release every entry this object holds and trim the cache to its limit."""
        for entry in self._held:
            entry.release()
        self._held.clear()
        self.cache.evict()
