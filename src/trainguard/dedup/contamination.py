"""Train/eval contamination: eval examples whose text is in the training data (D250).

Three rules over the normalised text (dedup's `normalise`: NFC, case folding, whitespace runs):
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
3. **edit**: the same containment, counted exactly over all of E's 5-grams, reaching
   `edit_containment` (0.35) in one training document: a lightly edited copy. A word changed
   every ten words breaks the 5 n-grams holding it, so about (1 - 1/10)^5 = 0.59 of E's 5-grams
   survive random edits and 5/10 = 0.5 evenly spaced ones; a word inserted every twelve words
   breaks the 4 n-grams spanning each gap: 8/12 = 0.67 survive. Both stay far below the MinHash
   rule's 0.8 and break every 13-gram, so the other rules miss them. Text that shares only
   common phrases with E stays low: on the planted sets of `benchmarks/bench_contamination.py`
   (40-100-word examples framed by two 8-word template phrases) unrelated documents reach at
   most 0.15 and documents holding E's two phrases and a 10-word quote of it at most 0.27, while
   the edited copies start at 0.50; 0.35 sits between, nearer the negatives (an example with
   fewer edits only scores higher). The limit: an example most of whose words are a template
   that training documents hold (a short question inside fixed instructions) can pass 0.35 by
   the template alone. Word 5-grams rather than 8-grams: (0.9)^8 = 0.43 (0.2 evenly spaced) of
   8-grams survive a word in ten changed, too close to shared phrases.
The first rule that matches names the match (`ngram`, then `minhash`, then `edit`), so examples
the first two rules found are reported as before.

The eval side is small and indexed in memory (sorted hash arrays); the training documents are
streamed once in batches (`contamination_scan.py`): memory does not grow with the corpus, and
the Spark engine (`contamination_spark.py`) scans parts with the same code. Pure: returns a
report; findings come from `ContaminationReport.findings`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trainguard.data.corpus import Document
from trainguard.dedup.contamination_scan import EvalIndex, Scan
from trainguard.dedup.lsh import DedupParams
from trainguard.dedup.minhash import MinHasher
from trainguard.findings import Finding

NGRAM = 13
"""Words per n-gram of the GPT-3 rule."""
CONTAINMENT = 0.8
"""Estimated containment in one training document at or above which an example is a near-copy."""
EDIT_CONTAINMENT = 0.35
"""Exact share of an example's word 5-grams in one training document at or above which it is an
edited copy (rule 3; the threshold's evidence is in the module docstring)."""


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
    match: str  # "ngram", "minhash" or "edit" (the first rule that matches, in that order)
    overlap: float
    containment: float = 0.0  # its highest exact 5-gram containment in one training document


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


def find_contamination(
    tasks: Sequence[EvalTask],
    documents: Iterable[Document],
    ngram: int = NGRAM,
    containment: float = CONTAINMENT,
    params: DedupParams | None = None,
    edit_containment: float = EDIT_CONTAINMENT,
) -> ContaminationReport:
    """Which examples of `tasks` occur in `documents` (streamed once, in order)."""
    t0 = time.perf_counter()
    index = eval_index(tasks, ngram, containment, edit_containment, params)
    return contamination_report(tasks, index, index.scan(documents), time.perf_counter() - t0)


def eval_index(
    tasks: Sequence[EvalTask],
    ngram: int = NGRAM,
    containment: float = CONTAINMENT,
    edit_containment: float = EDIT_CONTAINMENT,
    params: DedupParams | None = None,
) -> EvalIndex:
    """The examples of `tasks`, in order, indexed for `EvalIndex.scan`."""
    params = params or DedupParams()
    hasher = MinHasher(params.num_perm, params.seed, params.ngram)
    texts = [text for task in tasks for text in task.texts]
    return EvalIndex(
        texts,
        ngram,
        containment,
        edit_containment,
        params.num_perm,
        hasher.a,
        hasher.b,
        edit_ngram=params.ngram,
    )


def contamination_report(
    tasks: Sequence[EvalTask], index: EvalIndex, scan: Scan, seconds: float
) -> ContaminationReport:
    """The report of a finished scan (one pass, or the parts' scans merged in order)."""
    overlap = index.overlap(scan)
    report = [TaskContamination(t.spec, t.task, len(t.texts)) for t in tasks]
    flat = 0
    for ti, task in enumerate(tasks):
        for ei in range(len(task.texts)):
            for match, docs in (
                ("ngram", scan.ngram_docs),
                ("minhash", scan.minhash_docs),
                ("edit", scan.edit_docs),
            ):
                if docs.get(flat):
                    report[ti].contaminated.append(
                        Contaminated(
                            ei,
                            docs[flat],
                            match,
                            round(float(overlap[flat]), 6),
                            round(float(scan.edit_best[flat]), 6),
                        )
                    )
                    break
            flat += 1
    return ContaminationReport(report, scan.documents, seconds)
