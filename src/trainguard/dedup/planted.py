"""Synthetic corpora with planted duplicates at known Jaccard similarities (tests, benchmarks).

Background documents are random words from a large vocabulary, so two of them share no word
5-gram. A near duplicate copies a base document and replaces one contiguous block of k words by
fresh words: that changes exactly k + 4 of its n shingles, so the true Jaccard similarity of the
pair is (n - k - 4) / (n + k + 4), which is solved for k to plant a target similarity.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from trainguard.dedup.minhash import shingle_hashes
from trainguard.dedup.normalise import normalise


def jaccard(a: str, b: str, ngram: int = 5) -> float:
    """True Jaccard similarity of the word n-gram shingle sets of two texts."""
    sa = set(shingle_hashes(normalise(a), ngram))
    sb = set(shingle_hashes(normalise(b), ngram))
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


@dataclass
class Planted:
    """Records in input order and what a correct deduplication must remove."""

    records: list[dict[str, Any]] = field(default_factory=list)
    # (later index, earlier index, true Jaccard, kind) of every planted pair
    pairs: list[tuple[int, int, float, str]] = field(default_factory=list)

    def must_remove(self, min_similarity: float) -> set[int]:
        return {i for i, _, s, _ in self.pairs if s >= min_similarity}

    def must_keep(self, max_similarity: float) -> set[int]:
        return {i for i, _, s, _ in self.pairs if s <= max_similarity}


class Generator:
    def __init__(self, seed: int = 0, vocab: int = 20000, words: int = 200) -> None:
        self.rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.vocab = ["".join(self.rng.choices(letters, k=7)) for _ in range(vocab)]
        self.words = words
        self.fresh = 0

    def doc(self, words: int | None = None) -> str:
        return " ".join(self.rng.choices(self.vocab, k=words or self.words))

    def near(self, text: str, similarity: float) -> str:
        """A copy of `text` whose shingle Jaccard similarity to it is close to `similarity`."""
        w = text.split(" ")
        n = len(w) - 4
        k = max(1, round(n * (1 - similarity) / (1 + similarity)) - 4)
        start = (len(w) - k) // 2
        new = []
        for _ in range(k):
            self.fresh += 1
            new.append(f"fresh{self.fresh}")
        return " ".join(w[:start] + new + w[start + k :])


def planted_corpus(
    n_background: int = 200,
    similarities: tuple[float, ...] = (0.95, 0.9, 0.5, 0.3),
    copies_each: int = 3,
    exact: int = 5,
    normalised: int = 5,
    seed: int = 0,
    words: int = 200,
) -> Planted:
    """Background documents, then exact, normalised and near copies of some of them, shuffled.

    Every record has `id`, `text`, `source` and a nested `meta` field, to check fields survive.
    """
    g = Generator(seed, words=words)
    texts = [g.doc() for _ in range(n_background)]
    kinds: list[tuple[str, int, float]] = []  # (kind, base background index, similarity)
    bases = iter(range(n_background))
    for _ in range(exact):
        texts.append(texts[b := next(bases)])
        kinds.append(("exact", b, 1.0))
    for j in range(normalised):
        b = next(bases)
        variant = [
            texts[b].upper(),
            "  " + texts[b].replace(" ", " \n\t ", 7) + "\n",
            texts[b].title(),
        ][j % 3]
        texts.append(variant)
        kinds.append(("normalised", b, 1.0))
    for s in similarities:
        for _ in range(copies_each):
            b = next(bases)
            texts.append(g.near(texts[b], s))
            kinds.append(("near", b, jaccard(texts[b], texts[-1])))
    # Shuffle the copies into the background but keep each copy after its base document.
    order = list(range(n_background))
    for j in range(len(kinds)):
        base_pos = order.index(kinds[j][1])
        order.insert(g.rng.randint(base_pos + 1, len(order)), n_background + j)
    pos = {src: i for i, src in enumerate(order)}
    out = Planted()
    for src in order:
        out.records.append(
            {
                "id": f"doc-{src}",
                "text": texts[src],
                "source": f"s{src % 3}",
                "meta": {"n": src, "tags": ["a", str(src)]},
            }
        )
    for j, (kind, b, s) in enumerate(kinds):
        out.pairs.append((pos[n_background + j], pos[b], s, kind))
    return out
