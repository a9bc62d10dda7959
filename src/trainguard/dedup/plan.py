"""From duplicate links to the clusters file rows and counts; shared by both engines.

Both engines hand over the same two maps, so they produce the same rows:
- `exact_rep`: {document: first earlier document with the same normalised text};
- `near_root`: {first-of-its-text document: root of its near-duplicate cluster}, from union-find.
A removed document points at the document that is finally kept for it. Its kind is `exact` when
their normalised texts are equal (similarity 1.0), else `near` with the estimated similarity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ClusterRow:
    """One removed document: removed in favour of `kept` (0-based input positions)."""

    removed: int
    kept: int
    kind: str  # "exact" or "near"
    similarity: float
    removed_id: Any = None
    kept_id: Any = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DedupCounts:
    input: int
    kept: int
    exact_duplicates: int
    near_duplicates: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def resolve(
    exact_rep: dict[int, int],
    near_root: dict[int, int],
    similarity: Callable[[int, int], float],
) -> list[ClusterRow]:
    """Rows sorted by the removed document's position; `similarity(a, b)` for near pairs."""
    rows = [ClusterRow(n, r, "near", round(similarity(n, r), 6)) for n, r in near_root.items()]
    near_sim = {row.removed: row.similarity for row in rows}
    for d, x in exact_rep.items():
        root = near_root.get(x, x)
        if root == x:
            rows.append(ClusterRow(d, x, "exact", 1.0))
        else:  # d copies x, which is itself a near duplicate of root
            rows.append(ClusterRow(d, root, "near", near_sim[x]))
    rows.sort(key=lambda row: row.removed)
    return rows


def with_ids(rows: list[ClusterRow], ids: Callable[[int], Any]) -> list[ClusterRow]:
    return [
        ClusterRow(r.removed, r.kept, r.kind, r.similarity, ids(r.removed), ids(r.kept))
        for r in rows
    ]


def count(n_input: int, rows: list[ClusterRow]) -> DedupCounts:
    exact = sum(r.kind == "exact" for r in rows)
    return DedupCounts(n_input, n_input - len(rows), exact, len(rows) - exact)
