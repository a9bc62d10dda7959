"""The eval-side index of the contamination check and the scan of training documents against it.

Split from `contamination.py` so that both engines run the same code: the local engine scans
the whole stream with one `EvalIndex.scan`; the Spark engine scans each source part on an
executor and merges the parts' `Scan`s in source order (`Scan.merge`), which gives the same
document ids, in the same order, as one pass.

Shingle hashes. Each distinct word of a document is hashed once (xxh3-64, cached across
documents: vocabularies repeat), and the hash of every word n-gram is a polynomial in its
words' hashes, computed for all positions at once with numpy, then mixed (splitmix64's
finaliser, with n folded in). Hashing every n-gram's joined string, twice (13-grams and
5-grams), was most of the old scan's time (2.3 MB/s here). The values differ from dedup's
`shingle_hashes`, but both sides of this check use these, and a 64-bit collision between two
different n-grams is as unlikely as before. A text shorter than n words is one shingle (its
whole word sequence), as in dedup.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

from trainguard.data.corpus import Document
from trainguard.dedup.normalise import normalise

MAX_TRAIN_IDS = 20
"""Training document ids listed per example at most (the first ones in training order)."""

_PRIME = np.uint64(0x9E3779B97F4A7C15)  # odd: each step of the polynomial is a bijection
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_CACHE_MAX = 1 << 20  # distinct words kept hashed (tens of MB at most)
_BATCH_WORDS = 1 << 16  # words of training text hashed and looked up in one numpy pass


def _mix(x: np.ndarray, n: int) -> np.ndarray:
    """splitmix64's finaliser of x ^ n: spreads the polynomial's high bits into the low ones."""
    with np.errstate(over="ignore"):
        x = x ^ np.uint64(n)
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


class WordHashes:
    """xxh3-64 of each word, cached (a dict lookup instead of an encode and a hash); kept as
    signed values, which numpy converts faster than Python ints above 2^63."""

    def __init__(self) -> None:
        self.cache: dict[str, int] = {}

    def __call__(self, words: list[str]) -> np.ndarray:
        cache = self.cache
        try:
            return np.fromiter(map(cache.__getitem__, words), np.int64, len(words)).view(np.uint64)
        except KeyError:
            if len(cache) > _CACHE_MAX:
                cache.clear()
            h = xxhash.xxh3_64_intdigest
            for w in words:
                if w not in cache:
                    v = h(w.encode("utf-8", "surrogatepass"))
                    cache[w] = v - (1 << 64) if v >> 63 else v
            return np.fromiter(map(cache.__getitem__, words), np.int64, len(words)).view(np.uint64)


def ngram_hashes(word_hashes: np.ndarray, n: int) -> np.ndarray:
    """The hash of every word n-gram (in order, repeats kept); fewer than n words: one."""
    if not len(word_hashes):
        return np.zeros(0, np.uint64)
    k = min(n, len(word_hashes))
    m = len(word_hashes) - k + 1
    with np.errstate(over="ignore"):
        acc = word_hashes[:m].copy()
        for j in range(1, k):
            acc *= _PRIME
            acc += word_hashes[j : j + m]
    return _mix(acc, k)


class _Index:
    """Sorted distinct hashes and, for each, the owners holding it (CSR; an owner is listed
    once per time it holds the key)."""

    def __init__(self, rows: list[tuple[int, np.ndarray]]) -> None:
        owners = np.concatenate([np.full(len(h), i, np.int64) for i, h in rows] or [np.zeros(0)])
        hashes = np.concatenate([h for _, h in rows] or [np.zeros(0, np.uint64)])
        order = np.lexsort((owners, hashes))
        hashes, owners = hashes[order].astype(np.uint64), owners[order].astype(np.int64)
        keys, starts = np.unique(hashes, return_index=True)
        self.keys = keys
        self.starts = np.append(starts, len(hashes))
        self.owners = owners
        self._table: np.ndarray | None = None

    def __getstate__(self) -> dict:
        # the filter table is rebuilt where it is used (a Spark executor), not shipped
        return {**self.__dict__, "_table": None}

    def maybe_held(self, hashes: np.ndarray) -> np.ndarray:
        """A mask of `hashes` that may be keys: a one-bit-per-slot filter on the low bits
        (16 slots per key, so about 6% of non-keys pass) that keeps the binary search to
        the few candidates; most training n-grams are in no eval example."""
        if self._table is None:
            size = 1 << max(10, min(30, int(16 * len(self.keys)).bit_length()))
            self._table = np.zeros(size, dtype=bool)
            self._table[(self.keys & np.uint64(size - 1)).astype(np.int64)] = True
        mask = np.uint64(len(self._table) - 1)
        return self._table[(hashes & mask).astype(np.int64)]

    def lookup(self, hashes: np.ndarray) -> np.ndarray:
        """Distinct positions in `keys` of those of `hashes` (any order, repeats) it holds."""
        if not len(self.keys) or not len(hashes):
            return np.zeros(0, np.int64)
        pos = np.searchsorted(self.keys, hashes)
        pos[pos == len(self.keys)] = 0
        return np.unique(pos[self.keys[pos] == hashes])

    def owners_of(self, positions: np.ndarray) -> np.ndarray:
        """The owners of the keys at `positions`, one entry per (owner, key) pair held."""
        lo, hi = self.starts[positions], self.starts[positions + 1]
        lens = hi - lo
        offsets = np.repeat(lo - np.cumsum(np.concatenate(([0], lens[:-1]))), lens)
        return self.owners[offsets + np.arange(int(lens.sum()))]


@dataclass
class Scan:
    """What scanning some training documents found; `merge` appends a later stretch's."""

    documents: int
    found: np.ndarray  # per n-gram key of the index: seen in some document
    ngram_docs: dict[int, list[str]] = field(default_factory=dict)
    minhash_docs: dict[int, list[str]] = field(default_factory=dict)
    edit_docs: dict[int, list[str]] = field(default_factory=dict)
    edit_best: np.ndarray | None = None  # per example: its highest containment in one document

    def merge(self, later: Scan) -> Scan:
        self.documents += later.documents
        self.found |= later.found
        for mine, theirs in (
            (self.ngram_docs, later.ngram_docs),
            (self.minhash_docs, later.minhash_docs),
            (self.edit_docs, later.edit_docs),
        ):
            for e, ids in theirs.items():
                mine[e] = (mine.get(e, []) + ids)[:MAX_TRAIN_IDS]
        np.maximum(self.edit_best, later.edit_best, out=self.edit_best)
        return self


def _batch_ngrams(hashes: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(document of each n-gram, its hash) for a batch: the documents' word hashes end to end,
    hashed in one pass, keeping the n-grams inside one document (as `ngram_hashes` per
    document would give them)."""
    lens = np.array([len(h) for h in hashes], dtype=np.int64)
    short = np.flatnonzero(lens < n)
    words = np.concatenate(hashes)
    ends = np.cumsum(lens)
    doc_of_word = np.repeat(np.arange(len(hashes)), lens)
    m = len(words) - n + 1
    if m > 0:
        with np.errstate(over="ignore"):
            acc = words[:m].copy()
            for j in range(1, n):
                acc *= _PRIME
                acc += words[j : j + m]
        inside = np.arange(m) + n <= ends[doc_of_word[:m]]
        docs, values = doc_of_word[:m][inside], _mix(acc[inside], n)
    else:
        docs, values = np.zeros(0, np.int64), np.zeros(0, np.uint64)
    if len(short):  # a document shorter than n words is one shingle of all its words
        docs = np.concatenate([docs, short])
        values = np.concatenate([values, *(ngram_hashes(hashes[d], n) for d in short)])
    return docs, values


def _pairs(index: _Index, batch: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (document, key position) pairs of a batch's n-grams that `index` holds."""
    docs, values = batch
    if not len(index.keys) or not len(values):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    maybe = index.maybe_held(values)
    docs, values = docs[maybe], values[maybe]
    pos = np.searchsorted(index.keys, values)
    pos[pos == len(index.keys)] = 0
    hit = index.keys[pos] == values
    code = np.unique(docs[hit] * len(index.keys) + pos[hit])
    return code // len(index.keys), code % len(index.keys)


def _owner_counts(
    index: _Index, docs: np.ndarray, positions: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document, example, keys held) for each pair sharing a key, by document then example."""
    lens = index.starts[positions + 1] - index.starts[positions]
    owners = index.owners_of(positions)
    n = int(owners.max()) + 1 if len(owners) else 1
    code, counts = np.unique(np.repeat(docs, lens) * n + owners, return_counts=True)
    return code // n, code % n, counts


def _note_pairs(
    notes: dict[int, list[str]], docs: np.ndarray, examples: np.ndarray, ids: list[str]
) -> None:
    """Note each (document, example) pair, documents in order, the first ids only."""
    for d, e in zip(docs.tolist(), examples.tolist(), strict=True):
        got = notes.setdefault(e, [])
        if len(got) < MAX_TRAIN_IDS:
            got.append(ids[d])


class EvalIndex:
    """Every example's n-gram hashes (13-gram rule), its full set of edit n-grams (containment
    rule) and its MinHash draws (a subset of the 5-grams), indexed for lookups."""

    def __init__(
        self,
        texts: Sequence[str],
        ngram: int,
        containment: float,
        edit_containment: float,
        num_perm: int,
        minhash_a: np.ndarray,
        minhash_b: np.ndarray,
        edit_ngram: int,
    ) -> None:
        self.ngram, self.edit_ngram = ngram, edit_ngram
        self.edit_containment = edit_containment
        self.need_minhash = int(np.ceil(containment * num_perm - 1e-9))
        words = WordHashes()
        grams, edits, sketch = [], [], []
        for e, text in enumerate(texts):
            norm = normalise(text)
            wh = words(norm.split(" ")) if norm else np.zeros(0, np.uint64)
            grams.append((e, np.unique(ngram_hashes(wh, ngram))))
            small = np.unique(ngram_hashes(wh, edit_ngram))
            edits.append((e, small))
            if len(small):
                with np.errstate(over="ignore"):  # wraps mod 2^64 on purpose
                    values = minhash_a * small[None, :] + minhash_b
                # per MinHash function, the shingle with the smallest hash: a uniform draw
                sketch.append((e, small[np.argmin(values, axis=1)]))
        self.examples = len(texts)
        self.n_grams = np.array([len(h) for _, h in grams], dtype=np.int64)
        self.n_edits = np.array([len(h) for _, h in edits], dtype=np.int64)
        self.grams = _Index(grams)
        self.edits = _Index(edits)
        self.sketch = _Index(sketch)  # a shingle drawn by several functions counts that often

    def empty_scan(self) -> Scan:
        return Scan(
            0, np.zeros(len(self.grams.keys), dtype=bool), edit_best=np.zeros(self.examples)
        )

    def scan(self, documents: Iterable[Document]) -> Scan:
        """Look every document up, streamed: only the ids and word hashes of the current batch
        (about `_BATCH_WORDS` words) are held, never the documents."""
        out = self.empty_scan()
        words = WordHashes()
        ids: list[str] = []
        hashes: list[np.ndarray] = []
        held = 0
        for doc in documents:
            out.documents += 1
            text = doc.text
            # normalise(text).split(" ") without the join and second split (same words)
            ws = text.lower().split() if text.isascii() else normalise(text).split()
            if not ws:
                continue
            ids.append(doc.id)
            hashes.append(words(ws))
            held += len(hashes[-1])
            if held >= _BATCH_WORDS:
                self._scan_batch(ids, hashes, out)
                ids, hashes, held = [], [], 0
        if ids:
            self._scan_batch(ids, hashes, out)
        return out

    def _scan_batch(self, ids: list[str], hashes: list[np.ndarray], out: Scan) -> None:
        """One numpy pass over a batch of documents; ids noted in document order."""
        pairs = _pairs(self.grams, _batch_ngrams(hashes, self.ngram))
        if len(pairs[0]):
            out.found[pairs[1]] = True
            doc, ex, _ = _owner_counts(self.grams, *pairs)
            _note_pairs(out.ngram_docs, doc, ex, ids)
        doc_of, keypos = _pairs(self.edits, _batch_ngrams(hashes, self.edit_ngram))
        if not len(doc_of):
            return
        # containment of each (document, example) sharing an n-gram: O(hits), not O(examples)
        doc, ex, counts = _owner_counts(self.edits, doc_of, keypos)
        share = counts / np.maximum(self.n_edits[ex], 1)
        np.maximum.at(out.edit_best, ex, share)
        over = share >= self.edit_containment - 1e-12
        _note_pairs(out.edit_docs, doc[over], ex[over], ids)
        # the MinHash draws are edit n-grams: look up only the hits
        sk_doc, sk_pos = _pairs(self.sketch, (doc_of, self.edits.keys[keypos]))
        if len(sk_doc):
            doc, ex, votes = _owner_counts(self.sketch, sk_doc, sk_pos)
            ok = votes >= self.need_minhash
            _note_pairs(out.minhash_docs, doc[ok], ex[ok], ids)

    def overlap(self, scan: Scan) -> np.ndarray:
        """Per example: the share of its n-grams found anywhere in the scanned documents."""
        found = np.bincount(
            self.grams.owners_of(np.flatnonzero(scan.found)), minlength=self.examples
        )
        return np.where(self.n_grams > 0, found / np.maximum(self.n_grams, 1), 0.0)
