"""Packed token shards: writing them, verifying them, and reading samples from them.

A split is one packed stream (documents joined by EOT) cut into `.bin` files of raw uint16 or
uint32 tokens. `manifest.json` lists every file with its size and xxh3 checksum, and carries a
checksum of itself; nothing is read before every file matches (a damaged shard would otherwise
train silently on garbage). Per split, `<split>.doc_index.npy` holds (token offset, label id)
for every document start and `<split>.doc_labels.json` the label names.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.errors import CorruptError
from trainguard.findings import Finding
from trainguard.util.hashing import bytes_checksum, file_checksum

MANIFEST = "manifest.json"
# Bump when the layout or the meaning of any file changes: old caches then get a new key.
FORMAT_VERSION = 1
SPLITS = ("train", "val")


def dtype_for(vocab_size: int) -> str:
    """The narrowest unsigned dtype holding every token id."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def _file_entry(path: Path) -> dict[str, Any]:
    return {"file": path.name, "size": path.stat().st_size, "checksum": file_checksum(path)}


class ShardWriter:
    """Appends documents' tokens to one split's stream, cutting a shard every `shard_tokens`."""

    def __init__(self, folder: Path, split: str, dtype: str, shard_tokens: int) -> None:
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, shard_tokens
        self._pending: list[np.ndarray] = []
        self._pending_n = 0
        self._shards: list[dict[str, Any]] = []
        self._doc_starts: list[int] = []
        self._doc_labels: list[int] = []
        self._label_ids: dict[str, int] = {}
        self.n_tokens = 0
        self.docs = 0
        self.bytes = 0

    def add(self, tokens: np.ndarray, label: str, n_bytes: int) -> None:
        """One document's tokens, EOT already appended."""
        self._doc_starts.append(self.n_tokens)
        self._doc_labels.append(self._label_ids.setdefault(label, len(self._label_ids)))
        self._pending.append(tokens.astype(self.dtype, copy=False))
        self._pending_n += len(tokens)
        self.n_tokens += len(tokens)
        self.docs += 1
        self.bytes += n_bytes
        while self._pending_n >= self.shard_tokens:
            self._flush(self.shard_tokens)

    def _flush(self, n: int) -> None:
        stream = np.concatenate(self._pending)
        self._shards.append(write_shard(self.folder, self.split, len(self._shards), stream[:n]))
        rest = stream[n:]
        self._pending, self._pending_n = ([rest] if len(rest) else []), len(rest)

    def close(self) -> dict[str, Any]:
        """Write the last shard and the document index; the split's manifest entry."""
        if self._pending_n:
            self._flush(self._pending_n)
        return split_entry(
            self.folder,
            self.split,
            self.dtype,
            self._shards,
            self._doc_starts,
            self._doc_labels,
            list(self._label_ids),
            self.bytes,
        )


def write_shard(folder: Path, split: str, k: int, tokens: np.ndarray) -> dict[str, Any]:
    """Shard k of a split: its raw tokens in `<split>-<k>.bin`; the manifest entry."""
    path = folder / f"{split}-{k:05d}.bin"
    tokens.tofile(path)
    return {**_file_entry(path), "dtype": str(tokens.dtype), "n_tokens": len(tokens)}


def split_entry(
    folder: Path,
    split: str,
    dtype: str,
    shards: list[dict[str, Any]],
    doc_starts: list[int] | np.ndarray,
    doc_labels: list[int] | np.ndarray,
    labels: list[str],
    n_bytes: int,
) -> dict[str, Any]:
    """Write a split's document index and label names; its manifest entry (every engine)."""
    index = np.stack(
        [np.asarray(doc_starts, np.int64), np.asarray(doc_labels, np.int64)], 1
    ).reshape(-1, 2)
    index_path = folder / f"{split}.doc_index.npy"
    np.save(index_path, index, allow_pickle=False)
    labels_path = folder / f"{split}.doc_labels.json"
    labels_path.write_text(json.dumps(labels), encoding="utf-8")
    return {
        "docs": len(index),
        "bytes": n_bytes,
        "n_tokens": sum(s["n_tokens"] for s in shards),
        "dtype": dtype,
        "shards": shards,
        "doc_index": _file_entry(index_path),
        "doc_labels": _file_entry(labels_path),
    }


def manifest_checksum(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return bytes_checksum(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    manifest = {**manifest, "checksum": manifest_checksum(manifest)}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True), "utf-8")


def _corrupt(code: str, path: Path, message: str) -> Finding:
    return Finding.of(code, f"corrupt {path}: {message}", where=str(path))


def read_manifest(folder: Path) -> tuple[dict[str, Any] | None, list[Finding]]:
    """The manifest if it is intact, else None and a D103 finding saying why."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return None, [_corrupt("D103", path, "the manifest is missing")]
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, [_corrupt("D103", path, f"not valid JSON (truncated or edited?): {e}")]
    if not isinstance(manifest, dict) or "checksum" not in manifest:
        return None, [_corrupt("D103", path, "no self-checksum field")]
    if manifest.get("format_version") != FORMAT_VERSION:
        found = manifest.get("format_version")
        return None, [_corrupt("D103", path, f"format {found}, expected {FORMAT_VERSION}")]
    actual = manifest_checksum(manifest)
    if actual != manifest["checksum"]:
        msg = f"checksum mismatch: expected {manifest['checksum']}, actual {actual} (edited?)"
        return None, [_corrupt("D103", path, msg)]
    return manifest, []


def _check_file(folder: Path, entry: dict[str, Any], expect_size: int | None = None) -> list:
    path = folder / entry["file"]
    try:
        st = path.stat()
    except FileNotFoundError:
        return [_corrupt("D102", path, "the file is missing")]
    except OSError as e:
        return [_corrupt("D102", path, f"cannot be read ({e.strerror or e})")]
    if stat.S_ISDIR(st.st_mode):
        return [_corrupt("D102", path, "a folder, not a file")]
    if not stat.S_ISREG(st.st_mode):  # never read (a pipe would hang the checksum)
        return [_corrupt("D102", path, "not a regular file (a device, pipe or socket)")]
    size = st.st_size
    want = entry["size"] if expect_size is None else expect_size
    if size != want:
        return [_corrupt("D102", path, f"size {size} bytes, expected {want} (truncated?)")]
    actual = file_checksum(path)
    if actual != entry["checksum"]:
        return [
            _corrupt(
                "D102", path, f"checksum mismatch: expected {entry['checksum']}, actual {actual}"
            )
        ]
    return []


def verify_dir(folder: str | Path) -> list[Finding]:
    """Every problem with a prepared folder, as D102 (file) and D103 (manifest) findings."""
    folder = Path(folder)
    manifest, findings = read_manifest(folder)
    if manifest is None:
        return findings
    findings += _check_file(folder, manifest["tokenizer"])
    for split in SPLITS:
        meta = manifest["splits"][split]
        for shard in meta["shards"]:
            size = shard["n_tokens"] * np.dtype(shard["dtype"]).itemsize
            findings += _check_file(folder, shard, expect_size=size)
        findings += _check_file(folder, meta["doc_index"])
        findings += _check_file(folder, meta["doc_labels"])
    return findings


def raise_if_corrupt(findings: list[Finding], folder: Path) -> None:
    if findings:
        more = f" (and {len(findings) - 1} more problems)" if len(findings) > 1 else ""
        # Never advise deleting: the folder may not be ours, and a damaged one is evidence.
        raise CorruptError(
            findings[0].message + more,
            f"move {folder} aside (mv {folder} {folder}.bad) and run again: the data is "
            "re-prepared from the source",
        )


class TokenDataset:
    """One split's verified shards as a single packed token stream of memory maps."""

    def __init__(
        self,
        folder: str | Path,
        meta: dict[str, Any],
        shard_path: Callable[[dict[str, Any]], Path] | None = None,
    ) -> None:
        """`shard_path(entry)`: where a shard's verified file is, asked the first time the
        shard is read (remote data fetches it then, data/remote.py); default `folder/file`."""
        folder = Path(folder)
        self.meta = meta
        self.docs: int = meta["docs"]
        self.bytes: int = meta["bytes"]
        self.n_tokens: int = meta["n_tokens"]
        self._shard_path = shard_path or (lambda entry: folder / entry["file"])
        self._shards: list[np.memmap | None] = [None] * len(meta["shards"])
        # _starts[k] = stream offset of shard k's first token; last entry = n_tokens.
        self._starts = np.cumsum([0] + [s["n_tokens"] for s in meta["shards"]])
        index = np.load(folder / meta["doc_index"]["file"], allow_pickle=False)
        self.doc_offsets: np.ndarray = index[:, 0]
        self._doc_label_ids: np.ndarray = index[:, 1]
        self.doc_labels: list[str] = json.loads((folder / meta["doc_labels"]["file"]).read_text())

    def _shard(self, k: int) -> np.memmap:
        """Shard k as a memory map, opened on first use."""
        shard = self._shards[k]
        if shard is None:
            entry = self.meta["shards"][k]
            path = self._shard_path(entry)
            shard = np.memmap(path, dtype=entry["dtype"], mode="r", shape=(entry["n_tokens"],))
            self._shards[k] = shard
        return shard

    @property
    def bytes_per_token(self) -> float:
        """UTF-8 bytes per token, to turn nats per token into bits per byte."""
        return self.bytes / self.n_tokens

    def num_samples(self, seq_len: int) -> int:
        """Samples of seq_len+1 tokens starting every seq_len tokens (targets overlap inputs)."""
        return max(0, (self.n_tokens - 1) // seq_len)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the stream as int64, read across shard boundaries."""
        if not 0 <= start <= stop <= self.n_tokens:
            raise IndexError(f"tokens [{start}, {stop}) outside the stream of {self.n_tokens}")
        k = int(np.searchsorted(self._starts, start, side="right")) - 1
        parts = []
        while start < stop:
            lo = start - int(self._starts[k])
            hi = min(stop, int(self._starts[k + 1])) - int(self._starts[k])
            parts.append(self._shard(k)[lo:hi])
            start += hi - lo
            k += 1
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def samples(self, ids: np.ndarray, seq_len: int) -> np.ndarray:
        """(n, seq_len+1) int64: sample i is tokens [i*seq_len, i*seq_len+seq_len+1)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = self.num_samples(seq_len)
        if len(ids) and (ids.min() < 0 or ids.max() >= n):
            raise IndexError(f"sample ids must be in [0, {n}) for seq_len={seq_len}")
        out = np.empty((len(ids), seq_len + 1), dtype=np.int64)
        for row, i in enumerate(ids.tolist()):
            out[row] = self.tokens(i * seq_len, i * seq_len + seq_len + 1)
        return out

    def sample_sources(self, ids: np.ndarray, seq_len: int) -> list[str]:
        """The source label of the document each sample starts in."""
        starts = np.asarray(ids, dtype=np.int64).reshape(-1) * seq_len
        doc = np.searchsorted(self.doc_offsets, starts, side="right") - 1
        return [self.doc_labels[j] for j in self._doc_label_ids[doc].tolist()]


def data_identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a run must find unchanged on resume: tokenizer hash, per-split tokens and shards."""
    return {
        "tokenizer_hash": manifest["tokenizer_hash"],
        "splits": {
            s: {
                "n_tokens": manifest["splits"][s]["n_tokens"],
                "shards": [sh["checksum"] for sh in manifest["splits"][s]["shards"]],
            }
            for s in SPLITS
        },
    }


def identity_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between two data identities: "tokenizer", "train tokens", "val tokens"
    (empty when they are equal; ["identity"] when they differ otherwise)."""
    if recorded == current:
        return []
    what = []
    if recorded.get("tokenizer_hash") != current.get("tokenizer_hash"):
        what.append("tokenizer")
    for s in SPLITS:
        if (recorded.get("splits") or {}).get(s) != (current.get("splits") or {}).get(s):
            what.append(f"{s} tokens")
    return what or ["identity"]


def compare_identity(recorded: dict[str, Any], current: dict[str, Any]) -> list[Finding]:
    """D104 when the data a run resumes with is not the data it was started with."""
    what = identity_changes(recorded, current)
    if not what:
        return []
    return [
        Finding.of(
            "D104",
            f"the prepared data differs from the run's start: {', '.join(what)} changed",
            data={"recorded": recorded, "current": current},
        )
    ]
