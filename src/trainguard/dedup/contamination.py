"""Train/eval contamination: eval examples whose text is in the training data (D250).

Two rules over the normalised text (dedup's `normalise`: NFC, case folding, whitespace runs):
1. **n-gram** (GPT-3, Brown et al. 2020, appendix C): an example is contaminated when any of its
   13-grams of words occurs in a training document. `overlap` is the share of its 13-grams found
   anywhere in training. An example shorter than 13 words is one shingle (dedup's rule), so it
   only matches a training document that is exactly that text.
2. **minhash**: a short example inside a long document has a tiny Jaccard similarity with it, so
   near-copies (edits every few words break every 13-gram) are found by *containment*
   |E & D| / |E| over word 5-gram shingles. It is estimated with the dedup MinHash functions: for
   each of the 112 functions the shingle of E with the smallest hash is a uniform draw from E, so
   the share of those draws present in D estimates E's containment in D (Broder 1997; Koslicki
   and Zabeti 2019). An example is contaminated when that share reaches `containment` in one
   training document.

The eval side is small and indexed in memory (sorted hash arrays); the training documents are
streamed once, each shingled and looked up with a binary search: memory does not grow with the
corpus. Pure: returns a report; findings come from `ContaminationReport.findings`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from trainguard.data.corpus import Document
from trainguard.dedup.lsh import DedupParams
from trainguard.dedup.minhash import MinHasher, shingle_set
from trainguard.dedup.normalise import normalise
from trainguard.findings import Finding

NGRAM = 13
"""Words per n-gram of the GPT-3 rule."""
CONTAINMENT = 0.8
"""Estimated containment in one training document at or above which an example is a near-copy."""
MAX_TRAIN_IDS = 20
"""Training document ids listed per example at most (the first ones in training order)."""


@dataclass(frozen=True)
class EvalTask:
    """The examples of one task: `texts[i]` is example i as the task loads it."""

    spec: str
    task: str
    texts: Sequence[str]


@dataclass
class Contaminated:
    example: int
    train_ids: list[str]
    match: str  # "ngram" or "minhash"
    overlap: float


@dataclass
class TaskContamination:
    spec: str
    task: str
    examples: int
    contaminated: list[Contaminated] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return len(self.contaminated) / self.examples if self.examples else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "task": self.task,
            "examples": self.examples,
            "contaminated": [asdict(c) for c in self.contaminated],
        }


@dataclass
class ContaminationReport:
    tasks: list[TaskContamination]
    documents: int
    seconds: float

    def findings(self, max_fraction: float | None = None) -> list[Finding]:
        """One D250 per contaminated task: an error, or with `max_fraction` (pre-flight) a
        warning unless the task's contaminated share is above it."""
        out = []
        for t in self.tasks:
            if not t.contaminated:
                continue
            first = t.contaminated[0]
            share = t.fraction
            severity = "error" if max_fraction is None or share > max_fraction else "warning"
            limit = (
                "" if max_fraction is None else f" (preflight.contamination_max {max_fraction:g})"
            )
            out.append(
                Finding.of(
                    "D250",
                    f"task {t.task!r} of {t.spec}: {len(t.contaminated)} of {t.examples} "
                    f"examples ({share:.1%}) found in the training data{limit}; first: example "
                    f"{first.example} ({first.match} match, overlap {first.overlap:.2f}) in "
                    f"{', '.join(first.train_ids[:3])}",
                    severity=severity,
                    where=t.spec,
                    metric=t.task,
                    data={
                        "examples": t.examples,
                        "contaminated": len(t.contaminated),
                        "fraction": round(share, 6),
                        "training_documents": self.documents,
                    },
                )
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"tasks": [t.to_dict() for t in self.tasks]}


class _Index:
    """Sorted distinct hashes and, for each, the (owner, weight) pairs holding it (CSR)."""

    def __init__(self, rows: list[tuple[int, np.ndarray]]) -> None:
        owners = np.concatenate([np.full(len(h), i, np.int64) for i, h in rows] or [np.zeros(0)])
        hashes = np.concatenate([h for _, h in rows] or [np.zeros(0, np.uint64)])
        order = np.lexsort((owners, hashes))
        hashes, owners = hashes[order], owners[order].astype(np.int64)
        keys, starts = np.unique(hashes, return_index=True)
        self.keys = keys
        self.starts = np.append(starts, len(hashes))
        self.owners = owners

    def lookup(self, hashes: np.ndarray) -> np.ndarray:
        """Positions in `keys` of those of `hashes` (distinct) that the index holds."""
        if not len(self.keys) or not len(hashes):
            return np.zeros(0, np.int64)
        pos = np.searchsorted(self.keys, hashes)
        inside = pos < len(self.keys)
        pos = pos[inside]
        return pos[self.keys[pos] == hashes[inside]]

    def owners_of(self, positions: np.ndarray) -> np.ndarray:
        """The owners of the keys at `positions`, one entry per (owner, key) pair held."""
        lo, hi = self.starts[positions], self.starts[positions + 1]
        lens = hi - lo
        offsets = np.repeat(lo - np.cumsum(np.concatenate(([0], lens[:-1]))), lens)
        return self.owners[offsets + np.arange(int(lens.sum()))]


def _argmin_shingles(hasher: MinHasher, shingles: np.ndarray) -> np.ndarray:
    """For each MinHash function, the shingle with the smallest hash: a uniform draw from the
    set, the same draw the dedup signatures record the value of."""
    with np.errstate(over="ignore"):
        values = hasher.a * shingles[None, :] + hasher.b  # wraps mod 2^64 on purpose
    return shingles[np.argmin(values, axis=1)]


def find_contamination(
    tasks: Sequence[EvalTask],
    documents: Iterable[Document],
    ngram: int = NGRAM,
    containment: float = CONTAINMENT,
    params: DedupParams | None = None,
) -> ContaminationReport:
    """Which examples of `tasks` occur in `documents` (streamed once, in order)."""
    t0 = time.perf_counter()
    params = params or DedupParams()
    hasher = MinHasher(params.num_perm, params.seed, params.ngram)
    owner_of: list[tuple[int, int]] = []  # flat example number -> (task, example)
    grams: list[tuple[int, np.ndarray]] = []
    sketch: list[tuple[int, np.ndarray]] = []
    for ti, task in enumerate(tasks):
        for ei, text in enumerate(task.texts):
            flat = len(owner_of)
            owner_of.append((ti, ei))
            norm = normalise(text)
            grams.append((flat, shingle_set(norm, ngram)))
            small = shingle_set(norm, params.ngram)
            if len(small):
                sketch.append((flat, _argmin_shingles(hasher, small)))
    n_examples = len(owner_of)
    gram_index = _Index(grams)
    sketch_index = _Index(sketch)  # a shingle drawn by several functions counts that often
    n_grams = np.array([len(h) for _, h in grams], dtype=np.int64)
    found = np.zeros(len(gram_index.keys), dtype=bool)
    ngram_docs: list[list[str]] = [[] for _ in range(n_examples)]
    minhash_docs: list[list[str]] = [[] for _ in range(n_examples)]
    need = int(np.ceil(containment * params.num_perm - 1e-9))
    n_docs = 0
    for doc in documents:
        n_docs += 1
        norm = normalise(doc.text)
        hits = gram_index.lookup(shingle_set(norm, ngram))
        if len(hits):
            found[hits] = True
            for e in np.unique(gram_index.owners_of(hits)).tolist():
                if len(ngram_docs[e]) < MAX_TRAIN_IDS:
                    ngram_docs[e].append(doc.id)
        hits = sketch_index.lookup(shingle_set(norm, params.ngram))
        if len(hits):
            counts = np.bincount(sketch_index.owners_of(hits), minlength=n_examples)
            for e in np.flatnonzero(counts >= need).tolist():
                if len(minhash_docs[e]) < MAX_TRAIN_IDS:
                    minhash_docs[e].append(doc.id)
    # overlap: the share of each example's n-grams found anywhere in training
    found_per_example = np.bincount(
        gram_index.owners_of(np.flatnonzero(found)), minlength=n_examples
    )
    report = [TaskContamination(t.spec, t.task, len(t.texts)) for t in tasks]
    for flat, (ti, ei) in enumerate(owner_of):
        overlap = float(found_per_example[flat] / n_grams[flat]) if n_grams[flat] else 0.0
        if ngram_docs[flat]:
            row = Contaminated(ei, ngram_docs[flat], "ngram", round(overlap, 6))
        elif minhash_docs[flat]:
            row = Contaminated(ei, minhash_docs[flat], "minhash", round(overlap, 6))
        else:
            continue
        report[ti].contaminated.append(row)
    return ContaminationReport(report, n_docs, time.perf_counter() - t0)
