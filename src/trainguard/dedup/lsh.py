"""LSH banding, candidate verification and union-find clusters (Leskovec et al., MMDS ch. 3).

A signature of `bands * rows` values is cut into `bands` bands of `rows` values. Two documents
are candidates when all rows of at least one band agree, which happens with probability
1 - (1 - s^rows)^bands for Jaccard similarity s: the S-curve. Each candidate is then verified
against the signatures' Jaccard estimate, so a chance band collision between dissimilar documents
does not merge them. Verified pairs are joined by union-find whose root is the smallest input
index, so every cluster keeps its first document in input order.

The defaults, 14 bands of 8 rows (112 hash functions) over word 5-grams, are FineWeb's setting
(Penedo et al. 2024, datatrove's MinhashConfig).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

MAX_CHECKS = 64
"""A bucket member is verified against at most this many earlier members of its bucket."""


@dataclass(frozen=True)
class DedupParams:
    """The algorithm's parameters; both engines read the same ones."""

    threshold: float = 0.8
    """Estimated Jaccard similarity at or above which a candidate pair is merged."""
    bands: int = 14
    """LSH bands."""
    rows: int = 8
    """Signature values per band."""
    seed: int = 1
    """Seed of the MinHash functions: the same seed gives the same signatures everywhere."""
    ngram: int = 5
    """Words per shingle."""

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows

    @property
    def min_equal(self) -> int:
        """Equal signature positions needed to pass verification (integer, so exact everywhere)."""
        return int(np.ceil(self.threshold * self.num_perm - 1e-9))


def s_curve(s: np.ndarray | float, bands: int, rows: int) -> np.ndarray | float:
    """Probability that a pair of Jaccard similarity s becomes an LSH candidate."""
    return 1.0 - (1.0 - np.power(s, rows)) ** bands


_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64 keys: one hash per band of each signature, vectorised.

    Equal bands always get equal keys. Unequal bands colliding (p ~ 2^-64) only add a candidate,
    which verification then rejects, so the key needs to be fast rather than perfect.
    """
    n = sigs.shape[0]
    with np.errstate(over="ignore"):
        v = sigs[:, : bands * rows].reshape(n, bands, rows).astype(np.uint64)
        key = np.zeros((n, bands), dtype=np.uint64)
        for j in range(rows):
            key = (key ^ v[:, :, j]) * _M1
            key ^= key >> np.uint64(29)
        # splitmix64 finaliser: spreads the bits so the sort below sees uniform keys
        key = (key ^ (key >> np.uint64(30))) * _M2
        key = (key ^ (key >> np.uint64(27))) * _M3
        key ^= key >> np.uint64(31)
    return key


def bucket_edges(members: np.ndarray, sigs: np.ndarray, min_equal: int) -> list[tuple[int, int]]:
    """Verified edges (later, earlier) of one bucket; `members` ascending, `sigs` row-aligned.

    Each member after the first is linked to the earliest earlier member whose signature agrees in
    at least `min_equal` positions (at most MAX_CHECKS tried). Near duplicates almost always agree
    with the bucket's first member, so the common case is one vectorised comparison.
    """
    equal_first = np.count_nonzero(sigs[1:] == sigs[0], axis=1)
    edges: list[tuple[int, int]] = []
    for k in range(1, len(members)):
        if equal_first[k - 1] >= min_equal:
            edges.append((int(members[k]), int(members[0])))
            continue
        for j in range(1, min(k, MAX_CHECKS)):
            if np.count_nonzero(sigs[k] == sigs[j]) >= min_equal:
                edges.append((int(members[k]), int(members[j])))
                break
    return edges


def local_edges(idx: np.ndarray, sigs: np.ndarray, params: DedupParams) -> list[tuple[int, int]]:
    """All verified edges among documents `idx` (ascending input indices) with signatures `sigs`."""
    if len(idx) < 2:
        return []
    keys = band_keys(sigs, params.bands, params.rows)
    edges: list[tuple[int, int]] = []
    for b in range(params.bands):
        order = np.argsort(keys[:, b], kind="stable")  # stable: members stay in input order
        sk = keys[order, b]
        starts = np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))
        sizes = np.diff(np.concatenate((starts, [len(sk)])))
        for s, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist(), strict=True):
            rows = order[s : s + size]
            edges.extend(bucket_edges(idx[rows], sigs[rows], params.min_equal))
    return edges


class UnionFind:
    """Disjoint sets over arbitrary int ids; the root of a set is its smallest id."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while x != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    def union(self, x: int, y: int) -> None:
        rx, ry = self.find(x), self.find(y)
        if rx != ry:
            lo, hi = (rx, ry) if rx < ry else (ry, rx)
            self.parent[hi] = lo
            self.parent.setdefault(lo, lo)

    def roots(self, edges: Iterable[tuple[int, int]]) -> dict[int, int]:
        """Union all edges, then {node: root} for every node that is not its own root."""
        for x, y in edges:
            self.union(x, y)
        return {x: r for x in list(self.parent) if (r := self.find(x)) != x}
