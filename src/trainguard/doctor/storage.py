"""Storage: write, fsync, read back and checksum a file where checkpoints will go, with MB/s.

A local `checkpoint.dir` that does not exist yet is tested at its nearest existing parent (the
file system the run will write to; no folder is created). A URL `checkpoint.dir` (`s3://...`)
is tested through fsspec with the recipe's storage options: one object written, read back,
compared and deleted. Every probe runs in a helper thread with a deadline
(`distributed.hang_timeout_s`), so an unreachable store or a hung mount is a finding, never a
hang of the doctor.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from trainguard.doctor.report import LocalResult, RankContext
from trainguard.util.paths import is_remote, local_path

_CHUNK = 1 << 20


def with_deadline(fn: Callable[[], Any], seconds: float) -> Any:
    """`fn()` in a daemon thread; its result, its exception re-raised, or TimeoutError."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller, who decides
            box["error"] = e

    thread = threading.Thread(target=target, name="trainguard-doctor-storage", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _payload(mib: int, rank: int) -> bytes:
    return np.random.default_rng(rank).integers(0, 256, mib * _CHUNK, dtype=np.uint8).tobytes()


def _probe_name(ctx: RankContext) -> str:
    who = ctx.who
    return f".trainguard-doctor-{who.host}-r{who.rank}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"


def probe_local(folder: Path, name: str, data: bytes) -> dict[str, Any]:
    """Write `data` to `folder/name`, fsync, read back; sizes, seconds, checksums."""
    path = folder / name
    want = xxhash.xxh3_128(data).hexdigest()
    try:
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            for i in range(0, len(data), _CHUNK):
                f.write(data[i : i + _CHUNK])
            f.flush()
            os.fsync(f.fileno())
            if hasattr(os, "posix_fadvise"):  # read from the device, not the page cache
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        t1 = time.perf_counter()
        h = xxhash.xxh3_128()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        t2 = time.perf_counter()
    finally:
        path.unlink(missing_ok=True)
    return {"write_s": t1 - t0, "read_s": t2 - t1, "want": want, "got": h.hexdigest()}


def probe_url(url: str, options: dict[str, Any], name: str, data: bytes) -> dict[str, Any]:
    from trainguard.util.fsurl import open_filesystem

    fs, root = open_filesystem(url, options)
    key = f"{root}/{name}"
    want = xxhash.xxh3_128(data).hexdigest()
    t0 = time.perf_counter()
    fs.pipe_file(key, data)
    t1 = time.perf_counter()
    try:
        got = xxhash.xxh3_128(fs.cat_file(key)).hexdigest()
        t2 = time.perf_counter()
    finally:
        fs.rm_file(key)
    return {"write_s": t1 - t0, "read_s": t2 - t1, "want": want, "got": got}


def check_storage(ctx: RankContext) -> LocalResult:
    root = ctx.plan.checkpoint_dir
    data = _payload(ctx.sizes.storage_mib, ctx.who.rank)
    name = _probe_name(ctx)
    if is_remote(root):
        where = root
        probe = lambda: probe_url(root, ctx.plan.storage_options, name, data)  # noqa: E731
    else:
        folder = nearest_existing(local_path(root))
        where = str(folder)
        probe = lambda: probe_local(folder, name, data)  # noqa: E731
    out = LocalResult()
    out.figures["storage_path"] = where
    try:
        got = with_deadline(probe, ctx.plan.hang_timeout_s)
    except Exception as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        out.findings.append(
            ctx.who.finding(
                "H413",
                f"storage {where}: {type(e).__name__}: {reason}",
                path=where,
                error=reason,
            )
        )
        return out
    mb = len(data) / 1e6
    out.figures |= {
        "storage_mb": mb,
        "storage_write_mbps": mb / max(got["write_s"], 1e-9),
        "storage_read_mbps": mb / max(got["read_s"], 1e-9),
    }
    if got["want"] != got["got"]:
        out.findings.append(
            ctx.who.finding(
                "H413",
                f"storage {where}: the file read back differs from what was written "
                f"(checksum {got['got']} instead of {got['want']})",
                path=where,
            )
        )
    return out
