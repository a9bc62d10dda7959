"""Checkpoints on object storage (any fsspec URL: s3://, gs://, memory://, ...).

Object stores have no rename, so the commit protocol differs from the local one: payload
objects are uploaded first and verified (size, and read-back checksum unless disabled), and
only then is `manifest.json` uploaded as the commit marker. A prefix without a manifest is a
killed upload and is never loaded. Every transfer is retried with full-jitter backoff, metered
by a token bucket and offset by `rank * stagger_s`. The payload is staged in a local cache
folder, which then becomes the cached copy of the latest checkpoint so a resume on the same
machine does not download it again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from trainguard.checkpoint.local import (
    clean_stale_temps,
    install,
    new_temp_dir,
    remove_step_folder,
    write_manifest,
)
from trainguard.checkpoint.manifest import (
    MANIFEST,
    check_files,
    manifest_bytes,
    parse_manifest,
    parse_step_dirname,
    step_dirname,
    verify_local_folder,
)
from trainguard.checkpoint.retry import (
    RetryPolicy,
    RetryStats,
    TokenBucket,
    VerifyMismatch,
    retry_call,
)
from trainguard.errors import BadInputError
from trainguard.findings import Finding
from trainguard.util.hashing import CHUNK

# Extras to name when a URL needs a backend that is not installed.
_EXTRAS = {"s3": "trainguard[s3]", "s3a": "trainguard[s3]"}


def open_filesystem(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for `url`; BadInputError naming a missing backend."""
    import fsspec

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


class RemoteBackend:
    """Step prefixes `<root>/step-<N>/` on an fsspec filesystem, with a local cache."""

    remote = True

    def __init__(
        self,
        fs: Any,
        root: str,
        url: str,
        cache_dir: Path,
        policy: RetryPolicy,
        bucket: TokenBucket | None,
        rank: int = 0,
        on_phase: Callable[[str, int], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fs, self.root, self.url = fs, root, url.rstrip("/")
        self.cache_dir, self.policy, self.bucket = cache_dir, policy, bucket
        self.rank, self.on_phase, self.sleep = rank, on_phase, sleep
        self.stats = RetryStats()
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BadInputError(
                f"cannot create checkpoint cache folder {cache_dir}: {e.strerror or e}",
                "pass cache_dir= a writable local folder",
            ) from e
        clean_stale_temps(cache_dir)

    # -- paths and listing ---------------------------------------------------------------------
    def _rpath(self, step: int, name: str = "") -> str:
        base = f"{self.root}/{step_dirname(step)}"
        return f"{base}/{name}" if name else base

    def location(self, step: int) -> str:
        return f"{self.url}/{step_dirname(step)}"

    def _retry(self, fn: Callable[[], Any], what: str) -> Any:
        return retry_call(fn, self.policy, what, self.stats, self.sleep)

    def _listing(self) -> dict[int, dict[str, int]]:
        """{step: {relative name: size}} for every object under the root, in one listing."""

        def find() -> dict[str, Any]:
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache(self.root)
            try:
                return self.fs.find(self.root, detail=True)
            except FileNotFoundError:
                return {}

        out: dict[int, dict[str, int]] = {}
        prefix = self.fs._strip_protocol(self.root).rstrip("/") + "/"
        for name, info in self._retry(find, f"list {self.url}").items():
            rel = self.fs._strip_protocol(name)
            if not rel.startswith(prefix) or info.get("type") == "directory":
                continue
            head, _, rest = rel[len(prefix) :].partition("/")
            step = parse_step_dirname(head)
            if step is not None and rest:
                out.setdefault(step, {})[rest] = int(info.get("size") or 0)
        return out

    def step_folders(self) -> dict[int, bool]:
        return {s: MANIFEST in files for s, files in self._listing().items()}

    def _read_manifest(self, step: int) -> bytes | None:
        def cat() -> bytes | None:
            try:
                return self.fs.cat_file(self._rpath(step, MANIFEST))
            except FileNotFoundError:
                return None

        return self._retry(cat, f"read {self.location(step)}/{MANIFEST}")

    # -- transfers -----------------------------------------------------------------------------
    def _throttle(self, n: int) -> None:
        if self.bucket is not None:
            self.bucket.acquire(n)

    def _stagger(self) -> None:
        if self.rank > 0 and self.policy.stagger_s > 0:
            self.sleep(self.rank * self.policy.stagger_s)

    def _remote_checksum(self, rpath: str) -> str:
        h = xxhash.xxh3_128()
        with self.fs.open(rpath, "rb") as f:
            while chunk := f.read(CHUNK):
                self._throttle(len(chunk))
                h.update(chunk)
        return h.hexdigest()

    def _upload(self, local: Path, rpath: str, entry: dict[str, Any]) -> None:
        def once() -> None:
            with open(local, "rb") as src, self.fs.open(rpath, "wb") as dst:
                while chunk := src.read(CHUNK):
                    self._throttle(len(chunk))
                    dst.write(chunk)
            # Verify before anything relies on this object (the manifest, or pruning).
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache(rpath)
            size = int(self.fs.info(rpath)["size"])
            if size != entry["size"]:
                raise VerifyMismatch(f"{rpath}: uploaded {size} bytes, expected {entry['size']}")
            if self.policy.verify_checksums:
                actual = self._remote_checksum(rpath)
                if actual != entry["checksum"]:
                    raise VerifyMismatch(
                        f"{rpath}: read-back checksum {actual}, expected {entry['checksum']}"
                    )

        self._retry(once, f"upload {rpath}")

    def _remove_remote(self, step: int) -> None:
        # The manifest goes first, so a half-deleted step is never seen as committed.
        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self._rpath(step, MANIFEST))
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self._rpath(step), recursive=True)

        self._retry(rm, f"delete {self.location(step)}")

    def commit(self, step: int, stage: Path, manifest: dict[str, Any]) -> tuple[str, list[Finding]]:
        self.stats = RetryStats()
        self._stagger()
        if step in self._listing():
            self._remove_remote(step)  # a step saved again after a rollback
        for name, entry in sorted(manifest["files"].items()):
            self._upload(stage / name, self._rpath(step, name), entry)
        write_manifest(stage, manifest)
        if self.on_phase is not None:
            self.on_phase("checkpoint_rename", step)
        mbytes = (stage / MANIFEST).read_bytes()
        self._upload(
            stage / MANIFEST,
            self._rpath(step, MANIFEST),
            {"size": len(mbytes), "checksum": xxhash.xxh3_128(mbytes).hexdigest()},
        )
        # The staged folder becomes the cached copy of the newest checkpoint. The step is
        # already committed remotely, so a cache failure only costs a download on resume.
        try:
            install(stage, self.cache_dir / step_dirname(step))
            self._prune_cache(keep=step)
        except OSError:
            shutil.rmtree(stage, ignore_errors=True)
        return self.location(step), self.retry_findings(step, "save")

    def retry_findings(self, step: int, what: str) -> list[Finding]:
        out = []
        mismatches = [e for e in self.stats.errors if "VerifyMismatch" in e]
        if mismatches:
            out.append(
                Finding.of(
                    "C202",
                    f"{what} of step {step}: {len(mismatches)} uploaded object(s) did not match "
                    "and were uploaded again",
                    step=step,
                    where=self.location(step),
                    data={"errors": mismatches},
                )
            )
        if self.stats.retries:
            out.append(
                Finding.of(
                    "C203",
                    f"{what} of step {step} needed {self.stats.retries} retries",
                    step=step,
                    where=self.location(step),
                    data={"retries": self.stats.retries, "errors": self.stats.errors},
                )
            )
        return out

    def _prune_cache(self, keep: int) -> None:
        for entry in self.cache_dir.iterdir():
            step = parse_step_dirname(entry.name)
            if step is not None and step != keep:
                remove_step_folder(entry)

    # -- verification and loading --------------------------------------------------------------
    def verify(self, step: int, full: bool = True) -> list[Finding]:
        manifest, findings = parse_manifest(self._read_manifest(step), step, self.location(step))
        if manifest is None:
            return findings
        sizes = self._listing().get(step, {})

        def checksum_of(name: str) -> str:
            return self._retry(
                lambda: self._remote_checksum(self._rpath(step, name)), f"read {name}"
            )

        return check_files(
            manifest, sizes.get, checksum_of if full else None, self.location(step)
        )

    def fetch(self, step: int) -> tuple[Path, list[Finding], bool]:
        """(local verified folder, findings, from_cache); findings with errors mean corrupt."""
        self.stats = RetryStats()
        raw = self._read_manifest(step)
        manifest, findings = parse_manifest(raw, step, self.location(step))
        if manifest is None:
            return self.cache_dir / step_dirname(step), findings, False
        cached = self.cache_dir / step_dirname(step)
        notes: list[Finding] = []
        if cached.is_dir():
            same = (cached / MANIFEST).is_file() and (cached / MANIFEST).read_bytes() == raw
            problems = verify_local_folder(cached, step) if same else []
            if same and not problems:
                return cached, [], True
            why = "; ".join(f.message for f in problems) or "its manifest differs from the remote"
            notes.append(
                Finding.of(
                    "C205",
                    f"cached copy of step {step} not used ({why}); downloading it again",
                    step=step,
                    where=str(cached),
                )
            )
        self._stagger()
        stage = new_temp_dir(self.cache_dir, step)
        try:
            corrupt = self._download(step, manifest, stage)
            if corrupt:
                shutil.rmtree(stage, ignore_errors=True)
                return cached, notes + corrupt, False
            write_manifest(stage, manifest)
            install(stage, cached)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        self._prune_cache(keep=step)
        return cached, notes + self.retry_findings(step, "load"), False

    def _download(self, step: int, manifest: dict[str, Any], stage: Path) -> list[Finding]:
        """Download and checksum in one pass; findings for missing, short or corrupt objects."""
        sizes = self._listing().get(step, {})
        got: dict[str, str] = {}
        for name, entry in sorted(manifest["files"].items()):
            if sizes.get(name) != entry["size"]:
                continue  # check_files reports it; do not download a known-bad object
            dest = stage / name
            dest.parent.mkdir(parents=True, exist_ok=True)

            def once(name: str = name, dest: Path = dest) -> str:
                h = xxhash.xxh3_128()
                with self.fs.open(self._rpath(step, name), "rb") as src, open(dest, "wb") as dst:
                    while chunk := src.read(CHUNK):
                        self._throttle(len(chunk))
                        h.update(chunk)
                        dst.write(chunk)
                return h.hexdigest()

            got[name] = self._retry(once, f"download {name}")
        return check_files(manifest, sizes.get, got.__getitem__, self.location(step))

    def delete(self, step: int) -> list[Finding]:
        self._remove_remote(step)
        return []


def default_cache_dir(url: str) -> Path:
    from trainguard.util.hashing import stable_u64

    base = os.environ.get("TRAINGUARD_CACHE") or os.path.join("~", ".cache", "trainguard")
    return Path(base).expanduser() / "checkpoints" / f"{stable_u64(url):016x}"


__all__ = ["RemoteBackend", "default_cache_dir", "manifest_bytes", "open_filesystem"]
