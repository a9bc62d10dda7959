"""Run the rules over a whole source and filter it to files (`data filter`): the kept records,
the rejected ones with their reasons, and the counts. Sampling for `data inspect` is
`inspection.py`."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.data.corpus import Record, iter_records, source_kind
from trainguard.filters.base import FilterConfig
from trainguard.filters.records import REJECT_FIELDS, RecordWriter, output_paths, parquet_schemas
from trainguard.filters.registry import Rule, apply_rules, reasons, select_rules
from trainguard.findings import Finding
from trainguard.util.atomic import atomic_paths


@dataclass
class FilterSummary:
    """Counts of one filter pass. `by_code`: documents flagged by each code (a document rejected
    by several rules counts once per code)."""

    total: int = 0
    kept: int = 0
    rejected: int = 0
    by_code: dict[str, int] = field(default_factory=dict)
    kept_path: str = ""
    rejected_path: str = ""
    seconds: float = 0.0

    def findings(self) -> list[Finding]:
        """One finding per code that rejected documents: warnings, the filter did its job."""
        return [
            Finding.of(
                code,
                f"{n} of {self.total} documents rejected ({n / max(self.total, 1):.1%})",
                data={"documents": n},
            )
            for code, n in sorted(self.by_code.items())
        ]

    def to_dict(self) -> dict[str, object]:
        return {
            "total": self.total,
            "kept": self.kept,
            "rejected": self.rejected,
            "by_code": dict(sorted(self.by_code.items())),
            "kept_path": self.kept_path,
            "rejected_path": self.rejected_path,
            "seconds": round(self.seconds, 3),
        }


def filter_source(
    source: str | Path,
    out: str | Path,
    text_field: str = "text",
    config: FilterConfig | None = None,
    disabled: Iterable[str] = (),
) -> FilterSummary:
    """Write the documents of `source` that pass every rule to OUT, the others beside them."""
    t0 = time.perf_counter()
    rules = select_rules(disabled)
    kept_path, rejected_path, fmt = output_paths(source, out)
    kept_schema = rejected_schema = None
    if fmt == "parquet" and source_kind(source) == "parquet":
        kept_schema, rejected_schema = parquet_schemas(source)
    summary = FilterSummary(kept_path=str(kept_path), rejected_path=str(rejected_path))
    by_code: Counter[str] = Counter()
    with (
        atomic_paths(kept_path, rejected_path) as (kept_tmp, rejected_tmp),
        RecordWriter(kept_tmp, fmt, kept_schema) as kept,
        RecordWriter(rejected_tmp, fmt, rejected_schema) as rejected,
    ):
        summary.total = filter_into(
            iter_records(source, text_field), config, rules, kept, rejected, by_code
        )
    summary.kept, summary.rejected = kept.count, rejected.count
    summary.by_code = dict(by_code)
    summary.seconds = time.perf_counter() - t0
    return summary


def filter_into(
    records: Iterable[Record],
    config: FilterConfig | None,
    rules: tuple[Rule, ...],
    kept: RecordWriter,
    rejected: RecordWriter,
    by_code: Counter[str],
) -> int:
    """Write each record to `kept` or, with its reasons, to `rejected`; count rejections per
    code in `by_code`; return how many records were read (every engine runs this)."""
    total = 0
    codes_field, reasons_field = REJECT_FIELDS
    for rec in records:
        total += 1
        flags = apply_rules(rec.text, config, rules)
        if not flags:
            kept.write(rec.fields)
            continue
        why = reasons(flags)
        by_code.update(r["code"] for r in why)
        rejected.write(
            {
                **rec.fields,
                codes_field: [r["code"] for r in why],
                reasons_field: [f"{r['code']}: {r['message']}" for r in why],
            }
        )
    return total
