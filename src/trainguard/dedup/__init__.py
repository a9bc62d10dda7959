"""Deduplication at scale: exact (normalised hash) and near (MinHash LSH) duplicates.

`local.dedup_file` runs on one process; `spark.dedup_file_spark` runs the same algorithm on
PySpark. Both keep the first document of each cluster in input order, so they keep the same
documents on the same input (docs/dedup.md).
"""

from trainguard.dedup.lsh import DedupParams
from trainguard.dedup.plan import ClusterRow, DedupCounts

__all__ = ["ClusterRow", "DedupCounts", "DedupParams"]
