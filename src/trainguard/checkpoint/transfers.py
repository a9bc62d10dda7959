"""Single objects on an fsspec filesystem, moved with care for a shared store: every request
retried with full-jitter backoff (counted in `stats`, C203), metered by a token bucket, offset
by `rank * stagger_s`, and every upload read back and verified before anything relies on it.
`remote.RemoteBackend` moves a checkpoint's objects through one `ObjectTransfers`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from trainguard.checkpoint.retry import (
    RetryPolicy,
    RetryStats,
    TokenBucket,
    VerifyMismatch,
    retry_call,
)
from trainguard.util.hashing import CHUNK
from trainguard.util.paths import credentials_error

# Objects up to this size are read in one GET (manifests, loader state, small shards).
SMALL_OBJECT = 8 << 20


class ObjectTransfers:
    """Reads, uploads and checks of single objects of `fs` (under the URL `url`, for messages
    and credential errors), with the retry policy, byte-rate bucket and rank stagger."""

    def __init__(
        self,
        fs: Any,
        url: str,
        policy: RetryPolicy,
        bucket: TokenBucket | None,
        rank: int = 0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fs, self.url, self.policy, self.bucket = fs, url, policy, bucket
        self.rank, self.sleep = rank, sleep
        self.stats = RetryStats()

    def retry(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return retry_call(fn, self.policy, what, self.stats, self.sleep)
        except Exception as e:
            err = credentials_error(e, self.url)  # bad input (exit 2), not a storage fault
            if err is None:
                raise
            raise err from None

    def throttle(self, n: int) -> None:
        if self.bucket is not None:
            self.bucket.acquire(n)

    def stagger(self) -> None:
        if self.rank > 0 and self.policy.stagger_s > 0:
            self.sleep(self.rank * self.policy.stagger_s)

    def read_object(
        self, rpath: str, size_hint: int, sink: Any = None, limit: int | None = None
    ) -> tuple[int, str]:
        """(size, xxh3 checksum) of an object, streamed into `sink` (a binary file) if given;
        with `limit`, of its first `limit` bytes only (a manifest entry's size: never more).

        Small objects take one GET; large ones are streamed in 1 MiB reads.
        """
        h, n = xxhash.xxh3_128(), 0

        def take(chunk: bytes) -> None:
            nonlocal n
            self.throttle(len(chunk))
            h.update(chunk)
            n += len(chunk)
            if sink is not None:
                sink.write(chunk)

        if limit == 0:
            pass  # nothing to read (and a zero-length range is not a valid request)
        elif size_hint <= SMALL_OBJECT:
            take(self.fs.cat_file(rpath, start=0, end=limit))
        else:
            with self.fs.open(rpath, "rb") as f:
                while chunk := f.read(CHUNK if limit is None else min(CHUNK, limit - n)):
                    take(chunk)
        return n, h.hexdigest()

    def mismatch(self, rpath: str, entry: dict[str, Any]) -> str | None:
        """Why the object at `rpath` differs from `entry`, or None if it matches."""
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(rpath)
        if self.policy.verify_checksums:
            size, actual = self.read_object(rpath, entry["size"])
        else:
            size, actual = int(self.fs.info(rpath)["size"]), entry["checksum"]
        if size != entry["size"]:
            return f"{rpath}: uploaded {size} bytes, expected {entry['size']}"
        if actual != entry["checksum"]:
            return f"{rpath}: read-back checksum {actual}, expected {entry['checksum']}"
        return None

    def upload(self, local: Path, rpath: str, entry: dict[str, Any]) -> None:
        """Upload, then verify before anything relies on the object (the manifest, pruning).

        Each request is retried on its own; a verified mismatch re-uploads the whole object.
        """

        def put() -> None:
            with open(local, "rb") as src, self.fs.open(rpath, "wb") as dst:
                while chunk := src.read(CHUNK):
                    self.throttle(len(chunk))
                    dst.write(chunk)

        for attempt in range(self.policy.attempts):
            self.retry(put, f"upload {rpath}")
            why = self.retry(lambda: self.mismatch(rpath, entry), f"verify {rpath}")
            if why is None:
                return
            if attempt == self.policy.attempts - 1:
                raise VerifyMismatch(f"{why} (after {self.policy.attempts} uploads)")
            self.stats.record(f"verify {rpath}", VerifyMismatch(why))
            self.sleep(self.policy.backoff(attempt))
