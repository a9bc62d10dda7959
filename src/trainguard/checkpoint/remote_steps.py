"""The step prefixes `<root>/step-<N>/` under a checkpoint root on object storage: their paths,
one listing of every object, each step's manifest bytes, and the two ways a step leaves (copied
aside to `quarantine/` or `attic/`, manifest last; deleted, manifest first), so that at every
moment a step is either whole and committed or has no manifest. `remote.RemoteBackend` adds the
save and the load.
"""

from __future__ import annotations

import contextlib
from typing import Any

from trainguard.checkpoint.folder import MANIFEST_MAX_BYTES
from trainguard.checkpoint.local import SET_ASIDE, junk_reason
from trainguard.checkpoint.manifest import (
    MANIFEST,
    check_files,
    parse_manifest,
    parse_step_dirname,
    step_dirname,
)
from trainguard.checkpoint.transfers import ObjectTransfers
from trainguard.findings import Finding


class RemoteSteps:
    """The steps under `root` on the fsspec filesystem `fs` (`url` in messages); every request
    goes through `io` (retried, counted)."""

    def __init__(self, fs: Any, root: str, url: str, io: ObjectTransfers) -> None:
        self.fs, self.root, self.url, self.io = fs, root, url.rstrip("/"), io
        self.ignored: list[tuple[str, str]] = []  # top-level names of the last listing, not steps
        self._known: dict[int, dict[str, int]] | None = None  # the last listing
        self._manifests: dict[tuple[int, int], bytes | None] = {}

    # -- paths and listing ---------------------------------------------------------------------
    def _rpath(self, step: int, name: str = "") -> str:
        base = f"{self.root}/{step_dirname(step)}"
        return f"{base}/{name}" if name else base

    def location(self, step: int) -> str:
        return f"{self.url}/{step_dirname(step)}"

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
        ignored: dict[str, str] = {}
        prefix = self.fs._strip_protocol(self.root).rstrip("/") + "/"
        for name, info in self.io.retry(find, f"list {self.url}").items():
            rel = self.fs._strip_protocol(name)
            if not rel.startswith(prefix) or info.get("type") == "directory":
                continue
            head, _, rest = rel[len(prefix) :].partition("/")
            step = parse_step_dirname(head)
            if step is not None and rest:
                out.setdefault(step, {})[rest] = int(info.get("size") or 0)
            elif head not in SET_ASIDE:
                ignored[head] = junk_reason(head)
        self._known = out
        self.ignored = sorted(ignored.items())
        return out

    def step_folders(self) -> dict[int, bool]:
        return {s: MANIFEST in files for s, files in self._listing().items()}

    def has_step(self, step: int) -> bool:
        return step in (self._known if self._known is not None else self._listing())

    def move_aside(self, step: int, dest: str) -> str:
        """Copy step `step` to `<root>/<dest>/` (or `<dest>.1`, ...), manifest last, then
        remove it, manifest first: at every moment one of the two copies is whole."""
        names = sorted(self._listing().get(step, {}), key=lambda n: (n == MANIFEST, n))

        def taken(rel: str) -> bool:
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache(f"{self.root}/{rel}")
            try:
                return bool(self.fs.find(f"{self.root}/{rel}"))
            except FileNotFoundError:
                return False

        rel, n = dest, 0
        while self.io.retry(lambda r=rel: taken(r), f"list {self.url}/{dest}"):
            n += 1
            rel = f"{dest}.{n}"
        for name in names:
            src, dst = self._rpath(step, name), f"{self.root}/{rel}/{name}"
            self.io.retry(lambda s=src, d=dst: self.fs.copy(s, d), f"copy {src}")
        self._remove_remote(step, names)
        self._known = None
        return f"{self.url}/{rel}"

    def quick_status(self) -> dict[int, tuple[bool, bool]]:
        """{step: (committed, structurally valid)} from one listing plus each manifest."""
        out = {}
        for step, sizes in self._listing().items():
            if MANIFEST not in sizes:
                out[step] = (False, False)
                continue
            # Committed manifests are immutable; re-read one only if its size changed (an
            # edit). Loading always re-reads and verifies: this cache serves retention only.
            key = (step, sizes[MANIFEST])
            if key not in self._manifests:
                self._manifests[key] = self._read_manifest(step)
            manifest, _ = parse_manifest(self._manifests[key], step, self.location(step))
            ok = manifest is not None and not check_files(manifest, sizes.get, None, "")
            out[step] = (True, ok)
        return out

    def _read_manifest(self, step: int) -> bytes | None:
        def cat() -> bytes | None:
            try:
                path, cap = self._rpath(step, MANIFEST), MANIFEST_MAX_BYTES
                raw = self.fs.cat_file(path, start=0, end=cap)
                return raw if len(raw) < cap else b"\xff"  # too large to be one: C104
            except FileNotFoundError:
                return None

        return self.io.retry(cat, f"read {self.location(step)}/{MANIFEST}")

    def _remove_remote(self, step: int, names: list[str] | None = None) -> None:
        """Delete a step; the manifest goes first, so a half-deleted step is never committed."""
        if names is None:
            names = list(self._listing().get(step, {}))

        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(self._rpath(step, MANIFEST))
            rest = [self._rpath(step, n) for n in names if n != MANIFEST]
            if rest:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(rest)

        self.io.retry(rm, f"delete {self.location(step)}")

    def abort(self, step: int) -> None:
        """Best effort, one try: remove what a failed save uploaded (retention catches the rest)."""
        with contextlib.suppress(Exception):
            self._remove_remote(step, list(self._listing().get(step, {})))
        self._known = None

    def delete(self, step: int) -> list[Finding]:
        self._remove_remote(step, list((self._known or {}).get(step, {})) or None)
        if self._known is not None:
            self._known.pop(step, None)
        return []
