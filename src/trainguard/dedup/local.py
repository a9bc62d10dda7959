"""The local engine: exact then near deduplication of one source in one process (a JSON Lines or
Parquet file, a folder of text files, or `stdlib`: whatever `data.corpus` reads).

Pass 1 streams the input in batches: normalise, exact key, and a MinHash signature for the first
document of each normalised text (copies need none). The signatures and bands give candidate
pairs; those whose estimate is close to the threshold are checked exactly on a second read that
shingles only the documents in such pairs (skipped when there are none); union-find then decides
what to remove, and a last pass copies the kept records. Memory is one signature (4 bytes per
hash function) and one 16-byte key per distinct document, plus the shingle sets of the documents
checked exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.data.corpus import source_kind
from trainguard.dedup import io
from trainguard.dedup.lsh import DedupParams, UnionFind, exact_edges, local_links
from trainguard.dedup.minhash import MinHasher, shingle_set
from trainguard.dedup.normalise import exact_key, normalise
from trainguard.dedup.plan import resolve, with_ids
from trainguard.dedup.report import DedupReport, TextStats, check_params, default_clusters_path
from trainguard.errors import BadInputError
from trainguard.util.atomic import atomic_paths
from trainguard.util.paths import is_url


def dedup_texts(
    read_batches: Callable[[], Iterable[tuple[list[str], list[Any]]]], params: DedupParams
) -> tuple[int, dict[int, int], dict[int, int], np.ndarray, np.ndarray, list[Any], TextStats]:
    """The duplicate links of the `(texts, ids)` batches `read_batches()` yields (each call reads
    the input again from the start; a second call happens only for exact checks).

    Returns (n, exact_rep, near_root, uniq_idx, uniq_sigs, ids, stats): see plan.resolve.
    """
    hasher = MinHasher(params.num_perm, params.seed, params.ngram)
    first_of: dict[int, int] = {}
    exact_rep: dict[int, int] = {}
    idx_parts: list[np.ndarray] = []
    sig_parts: list[np.ndarray] = []
    ids: list[Any] = []
    stats = TextStats()
    n = 0
    for texts, batch_ids in read_batches():
        new_idx: list[int] = []
        new_norm: list[str] = []
        for text in texts:
            norm = normalise(text)
            stats.add(norm, params.ngram)
            key = exact_key(norm)
            rep = first_of.setdefault(key, n)
            if rep != n:
                exact_rep[n] = rep
            elif norm:  # an empty text has no shingles: only exact duplicates apply
                new_idx.append(n)
                new_norm.append(norm)
            n += 1
        ids.extend(batch_ids)
        if new_idx:
            idx_parts.append(np.array(new_idx, dtype=np.int64))
            sig_parts.append(hasher.signatures(new_norm))
    uniq_idx = np.concatenate(idx_parts) if idx_parts else np.zeros(0, dtype=np.int64)
    uniq_sigs = (
        np.concatenate(sig_parts) if sig_parts else np.zeros((0, params.num_perm), np.uint32)
    )
    edges, unsure = local_links(uniq_idx, uniq_sigs, params)
    if unsure:
        edges += exact_edges(unsure, _shingle_sets(read_batches, unsure, params), params.threshold)
    near_root = UnionFind().roots(edges)
    return n, exact_rep, near_root, uniq_idx, uniq_sigs, ids, stats


def _shingle_sets(
    read_batches: Callable[[], Iterable[tuple[list[str], list[Any]]]],
    pairs: list[tuple[int, int]],
    params: DedupParams,
) -> dict[int, np.ndarray]:
    """Shingle sets of the documents in `pairs`, from one more read of the input."""
    need = {i for pair in pairs for i in pair}
    out: dict[int, np.ndarray] = {}
    n = 0
    for texts, _ in read_batches():
        for text in texts:
            if n in need:
                out[n] = shingle_set(normalise(text), params.ngram)
            n += 1
    return out


def dedup_file(
    in_path: str | Path,
    out_path: str | Path,
    clusters_path: str | Path | None = None,
    params: DedupParams | None = None,
    text_field: str = "text",
    id_field: str = "id",
) -> DedupReport:
    """Deduplicate IN into OUT (same format) and write the clusters file; pure apart from files."""
    params = params or DedupParams()
    check_params(params)
    for name, value in (("IN", in_path), ("--out", out_path)):
        if is_url(value):
            raise BadInputError(
                f"{name} {value} is a URL; the local engine reads and writes local files",
                "use --engine spark for object storage, or copy the file to a local disk",
            )
    kind = source_kind(in_path)
    fmt = io.output_format(kind)
    out_path = Path(out_path)
    clusters_path = clusters_path or default_clusters_path(out_path)
    io.check_output(out_path, fmt, in_path, clusters_path)
    t0 = time.perf_counter()
    n, exact_rep, near_root, uniq_idx, uniq_sigs, ids, stats = dedup_texts(
        lambda: io.iter_batches(in_path, text_field, id_field), params
    )

    def similarity(a: int, b: int) -> float:
        ra, rb = np.searchsorted(uniq_idx, [a, b])
        return float(np.count_nonzero(uniq_sigs[ra] == uniq_sigs[rb])) / params.num_perm

    rows = with_ids(resolve(exact_rep, near_root, similarity), ids.__getitem__)
    keep = np.ones(n, dtype=bool)
    keep[[r.removed for r in rows]] = False
    # Both files appear together or not at all (a clusters URL is written before OUT appears).
    local = [p for p in (out_path, clusters_path) if not is_url(p)]
    with atomic_paths(*local) as tmps:
        io.write_kept(in_path, tmps[0], kind, keep)
        io.write_jsonl(tmps[1] if len(tmps) > 1 else clusters_path, [r.to_dict() for r in rows])
    seconds = time.perf_counter() - t0
    return DedupReport.build("local", params, n, rows, stats, seconds, out_path, clusters_path, fmt)
