"""Sample a source for inspection (`data inspect`): per-code counts over the whole source and a
uniform random draw of documents with the flags the rules raise on them."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trainguard.data.corpus import Record, iter_records
from trainguard.filters.base import FilterConfig, Flag
from trainguard.filters.registry import apply_rules, select_rules


@dataclass
class Sample:
    """A sampled document and the flags the rules raise on it."""

    index: int
    record: Record
    flags: list[Flag]


@dataclass
class Inspection:
    total: int
    flagged: int
    by_code: dict[str, int]
    samples: list[Sample]


def inspect_source(
    source: str | Path,
    n: int = 20,
    seed: int = 0,
    text_field: str = "text",
    config: FilterConfig | None = None,
    disabled: Iterable[str] = (),
    only_flagged: bool = False,
) -> Inspection:
    """Per-code document counts over the whole source, and `n` documents drawn uniformly at
    random (reservoir sampling, so one pass and O(n) memory; the same seed gives the same draw)."""
    rules = select_rules(disabled)
    rng = random.Random(seed)
    by_code: Counter[str] = Counter()
    reservoir: list[Sample] = []
    total = flagged = seen = 0
    for i, rec in enumerate(iter_records(source, text_field)):
        total += 1
        flags = apply_rules(rec.text, config, rules)
        if flags:
            flagged += 1
            by_code.update({f.code for f in flags})
        elif only_flagged:
            continue
        seen += 1
        if len(reservoir) < n:
            reservoir.append(Sample(i, rec, flags))
        else:
            j = rng.randrange(seen)
            if j < n:
                reservoir[j] = Sample(i, rec, flags)
    reservoir.sort(key=lambda s: s.index)
    return Inspection(total, flagged, dict(sorted(by_code.items())), reservoir)
