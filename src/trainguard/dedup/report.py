"""What a dedup run reports: counts, timing, parameters and its findings (pure, no printing)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.dedup.lsh import DedupParams
from trainguard.dedup.plan import ClusterRow, DedupCounts, count
from trainguard.errors import BadInputError
from trainguard.findings import Finding

HIGH_DUPLICATE_SHARE = 0.3
"""D202 fires when more than this share of the input is removed."""
SHORT_SHARE = 0.1
"""D203 fires when more than this share of documents is shorter than one shingle."""
MAX_HASHES = 4096
"""bands x rows at most: far above any published setting (FineWeb 112, datasketch 128-256)."""
BIG_CLUSTER_SHARE = 0.01
"""D204 fires when one cluster holds more than this share of the input (and 10+ documents)."""


@dataclass
class TextStats:
    """Per-document facts gathered in pass 1 for the findings."""

    empty: int = 0
    short: int = 0  # non-empty but fewer words than one shingle

    def add(self, normalised: str, ngram: int) -> None:
        if not normalised:
            self.empty += 1
        elif normalised.count(" ") + 1 < ngram:
            self.short += 1

    def merge(self, other: TextStats) -> TextStats:
        return TextStats(self.empty + other.empty, self.short + other.short)


def check_params(params: DedupParams) -> None:
    if not 0.0 < params.threshold <= 1.0:
        raise BadInputError(
            f"threshold {params.threshold} is out of range",
            "give a Jaccard similarity threshold in (0, 1], e.g. --threshold 0.8",
        )
    if params.bands < 1 or params.rows < 1:
        raise BadInputError(
            f"bands={params.bands} and rows={params.rows} must both be at least 1",
            "use the defaults (14 bands of 8 rows) or positive values",
        )
    if params.num_perm > MAX_HASHES:
        raise BadInputError(
            f"bands={params.bands} x rows={params.rows} = {params.num_perm} hash functions "
            f"exceeds the cap of {MAX_HASHES} (4 bytes per hash function per document)",
            "use the defaults (14 bands of 8 rows, FineWeb's setting) or fewer bands or rows",
        )
    if params.ngram < 1:
        raise BadInputError(f"ngram={params.ngram} must be at least 1", "use 5 (word 5-grams)")


def default_clusters_path(out_path: Path) -> Path:
    """`out.jsonl` -> `out.clusters.jsonl` next to it."""
    name = out_path.name
    for suffix in (".jsonl", ".ndjson", ".parquet"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return out_path.with_name(f"{name}.clusters.jsonl")


def dedup_findings(
    counts: DedupCounts, rows: list[ClusterRow], stats: TextStats, params: DedupParams
) -> list[Finding]:
    """D201 summary, D202 high duplicate share, D203 short documents, D204 giant cluster,
    D205 empty documents."""
    n = counts.input
    removed = counts.exact_duplicates + counts.near_duplicates
    findings = [
        Finding.of(
            "D201",
            f"removed {removed} of {n} documents: {counts.exact_duplicates} exact and "
            f"{counts.near_duplicates} near duplicates (Jaccard >= {params.threshold})",
            data=counts.to_dict(),
        )
    ]
    if n and removed / n > HIGH_DUPLICATE_SHARE:
        findings.append(
            Finding.of(
                "D202",
                f"{removed / n:.0%} of the documents are duplicates (more than "
                f"{HIGH_DUPLICATE_SHARE:.0%})",
                data={"share": removed / n, "removed": removed, "input": n},
            )
        )
    if n and stats.short / n > SHORT_SHARE:
        findings.append(
            Finding.of(
                "D203",
                f"{stats.short} of {n} documents have fewer than {params.ngram} words, so each "
                "is a single shingle and only near-exact copies of them can be matched",
                data={"short": stats.short, "input": n, "ngram": params.ngram},
            )
        )
    sizes = Counter(r.kept for r in rows)
    if sizes:
        kept, size = min(sizes.items(), key=lambda kv: (-kv[1], kv[0]))
        size += 1  # the kept document itself
        if size >= 10 and size > BIG_CLUSTER_SHARE * n:
            findings.append(
                Finding.of(
                    "D204",
                    f"one cluster holds {size} documents ({size / n:.1%} of the input), kept "
                    f"document #{kept}",
                    data={"kept": kept, "size": size, "input": n},
                )
            )
    if stats.empty:
        findings.append(
            Finding.of(
                "D205",
                f"{stats.empty} documents are empty after whitespace is collapsed",
                data={"empty": stats.empty},
            )
        )
    return findings


@dataclass
class DedupReport:
    engine: str
    params: DedupParams
    counts: DedupCounts
    rows: list[ClusterRow]
    seconds: float
    out_path: str
    clusters_path: str
    fmt: str
    findings: list[Finding] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        engine: str,
        params: DedupParams,
        n: int,
        rows: list[ClusterRow],
        stats: TextStats,
        seconds: float,
        out_path: Any,
        clusters_path: Any,
        fmt: str,
    ) -> DedupReport:
        counts = count(n, rows)
        return cls(
            engine,
            params,
            counts,
            rows,
            seconds,
            str(out_path),
            str(clusters_path),
            fmt,
            dedup_findings(counts, rows, stats, params),
        )

    def summary(self) -> dict[str, Any]:
        """The command-specific fields of `--json`."""
        return {
            "counts": self.counts.to_dict(),
            "seconds": round(self.seconds, 4),
            "docs_per_s": round(self.counts.input / self.seconds, 1) if self.seconds else None,
            "engine": self.engine,
            "bands": self.params.bands,
            "rows": self.params.rows,
            "threshold": self.params.threshold,
            "format": self.fmt,
            "out": self.out_path,
            "clusters": self.clusters_path,
        }
