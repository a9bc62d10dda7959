"""Data codes D201-D209: deduplication."""

from trainguard.codes import Code, register

_MINHASH = "Broder, On the resemblance and containment of documents, 1997"
_FINEWEB = "Penedo et al., The FineWeb Datasets, 2024 (MinHash, 5-grams, 14 bands of 8 rows)"
_LEE = "Lee et al., Deduplicating Training Data Makes Language Models Better, ACL 2022"
_MMDS = "Leskovec, Rajaraman, Ullman, Mining of Massive Datasets, ch. 3 (LSH banding)"


register(
    Code(
        code="D201",
        title="Duplicates removed (summary)",
        severity="info",
        catches="How many documents `data dedup` removed as exact duplicates (same text after "
        "NFC, case folding and whitespace collapsing) and as near duplicates (Jaccard "
        "similarity at or above the threshold: the MinHash estimate decides far from it, the "
        "exact similarity of the shingle sets within 4 standard deviations of it).",
        why="Duplicated documents waste compute, are memorised more, and skew evaluation when "
        "they overlap the test set.",
        fix="Nothing to do; the clusters file says which document was removed in favour of "
        "which, with the estimated similarity.",
        false_positives="A pair more than 4 standard deviations of the estimate "
        "(sqrt(s(1-s)/112)) above the threshold is merged without the exact check: about one "
        "pair in a million just below the threshold gets that far.",
        references=(_LEE, _FINEWEB),
    ),
    Code(
        code="D202",
        title="Large share of the corpus is duplicated",
        severity="warning",
        catches="More than 30% of the input documents were removed as duplicates.",
        why="A share that high usually means the pipeline ingested the same source twice, or a "
        "crawl is full of templates; the remaining data may be much smaller than planned, so "
        "token budgets and epoch counts are off.",
        fix="Check the sources for repeated ingestion, and re-plan the token budget on the kept "
        "count.",
        false_positives="Raw web crawls are often more than 30% duplicated; that is expected "
        "before deduplication.",
        references=(_LEE,),
    ),
    Code(
        code="D203",
        title="Many documents shorter than one shingle",
        severity="warning",
        catches="More than 10% of the documents have fewer words than the shingle size (5).",
        why="Such a document is a single shingle, so MinHash can only match it to a copy that is "
        "identical after normalisation: near-duplicate detection is blind for them.",
        fix="Filter very short documents first (`trainguard data filter`), or deduplicate them "
        "by another key; lower --ngram only if short texts are the real data.",
        false_positives="Corpora of short texts by design (titles, queries).",
        references=(_FINEWEB,),
    ),
    Code(
        code="D204",
        title="One giant duplicate cluster",
        severity="warning",
        catches="One cluster holds more than 1% of the input (and at least 10 documents).",
        why="Union-find joins chains of pairwise-similar documents, so templated pages (cookie "
        "banners, boilerplate) can merge many documents whose content differs; all but one are "
        "removed.",
        fix="Look at the cluster in the clusters file; strip the boilerplate before "
        "deduplicating, or raise --threshold.",
        false_positives="A corpus that truly holds many copies of one document.",
        references=(_MMDS,),
    ),
    Code(
        code="D205",
        title="Empty documents",
        severity="warning",
        catches="Documents whose text is empty or only whitespace.",
        why="They carry no training signal but still take an end-of-text token and a place in "
        "the order; they are all exact duplicates of each other, so all but the first are removed.",
        fix="Drop empty documents upstream (they usually mean a failed extraction).",
        references=(_MINHASH,),
    ),
)
