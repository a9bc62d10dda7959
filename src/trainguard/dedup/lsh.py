"""LSH banding, candidate verification and union-find clusters (Leskovec et al., MMDS ch. 3).

A signature of `bands * rows` values is cut into `bands` bands of `rows` values. Two documents
are candidates when all rows of at least one band agree, which happens with probability
1 - (1 - s^rows)^bands for Jaccard similarity s: the S-curve. Each candidate is then verified,
so a chance band collision between dissimilar documents does not merge them: a pair whose
signatures agree far above the threshold (4 standard deviations of the estimate) is merged, one
far below it is not, and a pair in between is decided by the exact Jaccard similarity of the two
shingle sets. The estimate alone (spread 0.038 at 0.8 with 112 hashes) would lose a few percent
of true pairs at 0.85 that LSH made candidates; the exact check keeps every candidate at or
above the threshold and costs one more read of only the documents in such pairs. Verified pairs
are joined by union-find whose root is the smallest input index, so every cluster keeps its
first document in input order.

The defaults, 14 bands of 8 rows (112 hash functions) over word 5-grams, are FineWeb's setting
(Penedo et al. 2024, datatrove's MinhashConfig).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

MAX_CHECKS = 64
"""A bucket member is verified against at most this many earlier members of its bucket."""


@dataclass(frozen=True)
class DedupParams:
    """The algorithm's parameters; both engines read the same ones."""

    threshold: float = 0.8
    """Jaccard similarity at or above which a candidate pair is merged."""
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
    def accept_equal(self) -> int:
        """Equal signature positions at or above which a candidate is merged without an exact
        check: the threshold plus 4 standard deviations of the estimate (integer, so every engine
        decides alike)."""
        return int(np.ceil((self.threshold + _Z * self._sd) * self.num_perm - 1e-9))

    @property
    def reject_equal(self) -> int:
        """Equal positions below which a candidate is rejected without an exact check."""
        return max(1, int(np.ceil((self.threshold - _Z * self._sd) * self.num_perm - 1e-9)))

    @property
    def _sd(self) -> float:
        t = self.threshold
        return float(np.sqrt(t * (1.0 - t) / self.num_perm))


_Z = 4.0
"""Standard deviations of the MinHash estimate around the threshold decided by exact Jaccard."""


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


Links = tuple[list[tuple[int, int]], list[tuple[int, int]]]
"""(edges, pairs to verify exactly): (later, earlier) input indices."""


def bucket_links(members: np.ndarray, sigs: np.ndarray, params: DedupParams) -> Links:
    """Edges and exact-check pairs of one bucket; `members` ascending, `sigs` row-aligned.

    Each member after the first is compared with earlier members (the first, then the others in
    order, at most MAX_CHECKS) until one agrees in at least `accept_equal` positions: that is its
    edge. Earlier members that agree in `reject_equal` positions or more on the way are pairs for
    the exact check. Near duplicates almost always agree with the bucket's first member, so the
    common case is one vectorised comparison.
    """
    accept, reject = params.accept_equal, params.reject_equal
    equal_first = np.count_nonzero(sigs[1:] == sigs[0], axis=1)
    edges: list[tuple[int, int]] = []
    unsure: list[tuple[int, int]] = []
    for k in range(1, len(members)):
        later = int(members[k])
        for j in range(min(k, MAX_CHECKS)):
            equal = equal_first[k - 1] if j == 0 else np.count_nonzero(sigs[k] == sigs[j])
            if equal >= accept:
                edges.append((later, int(members[j])))
                break
            if equal >= reject:
                unsure.append((later, int(members[j])))
    return edges, unsure


def local_links(idx: np.ndarray, sigs: np.ndarray, params: DedupParams) -> Links:
    """All links among documents `idx` (ascending input indices) with signatures `sigs`."""
    edges: list[tuple[int, int]] = []
    unsure: list[tuple[int, int]] = []
    if len(idx) < 2:
        return edges, unsure
    keys = band_keys(sigs, params.bands, params.rows)
    for b in range(params.bands):
        order = np.argsort(keys[:, b], kind="stable")  # stable: members stay in input order
        sk = keys[order, b]
        starts = np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))
        sizes = np.diff(np.concatenate((starts, [len(sk)])))
        for s, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist(), strict=True):
            rows = order[s : s + size]
            e, u = bucket_links(idx[rows], sigs[rows], params)
            edges += e
            unsure += u
    return edges, unsure


def exact_edges(
    pairs: Iterable[tuple[int, int]], shingles: Mapping[int, np.ndarray], threshold: float
) -> list[tuple[int, int]]:
    """The pairs whose exact shingle-set Jaccard similarity is at least `threshold`.

    `shingles[i]` is document i's sorted unique shingle hashes (`minhash.shingle_set`).
    """
    out = []
    for a, b in sorted(set(pairs)):
        sa, sb = shingles[a], shingles[b]
        inter = len(np.intersect1d(sa, sb, assume_unique=True))
        union = len(sa) + len(sb) - inter
        if union and inter >= threshold * union:
            out.append((a, b))
    return out


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
