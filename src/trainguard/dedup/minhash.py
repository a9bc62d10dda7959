"""Vectorised MinHash signatures over word 5-gram shingles (Broder 1997).

Each shingle (five consecutive words of the normalised text, joined by single spaces) is hashed
once with 64-bit xxh3. The `num_perm` hash functions are h_i(x) = (a_i * x + b_i) mod 2^64 with
odd a_i (a bijection on 64-bit words); the signature keeps, per function, the top 32 bits of the
minimum over the document's shingles. A whole batch of documents is hashed with three numpy passes
over a (num_perm, shingles) block and one `minimum.reduceat` per document boundary, so Python
work per document is only the shingle hashing.

The parameters a, b come from a PCG64 generator seeded with `seed`, so every process, machine and
engine computes the same signatures for the same text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

NGRAM = 5
"""Words per shingle (FineWeb and Gopher use word 5-grams)."""

_EMPTY = np.uint32(0xFFFFFFFF)
# Shingles hashed per numpy block: a (num_perm, _BLOCK) uint64 buffer of ~3.6 MB stays in cache.
_BLOCK = 4096


def shingle_hashes(normalised: str, ngram: int = NGRAM) -> list[int]:
    """xxh3-64 of each word n-gram; a text shorter than n words is one shingle (if non-empty)."""
    if not normalised:
        return []
    words = normalised.split(" ")
    h = xxhash.xxh3_64_intdigest
    if len(words) <= ngram:
        return [h(normalised.encode("utf-8", "surrogatepass"))]
    return [
        h(" ".join(words[i : i + ngram]).encode("utf-8", "surrogatepass"))
        for i in range(len(words) - ngram + 1)
    ]


def shingle_set(normalised: str, ngram: int = NGRAM) -> np.ndarray:
    """The sorted distinct shingle hashes of a text: its shingle set, for exact Jaccard."""
    return np.unique(np.array(shingle_hashes(normalised, ngram), dtype=np.uint64))


class MinHasher:
    """Computes (n, num_perm) uint32 signatures for batches of normalised texts."""

    def __init__(self, num_perm: int = 112, seed: int = 1, ngram: int = NGRAM) -> None:
        if num_perm < 1:
            raise ValueError("num_perm must be positive")
        self.num_perm = num_perm
        self.seed = seed
        self.ngram = ngram
        rng = np.random.Generator(np.random.PCG64(seed))
        hi = np.iinfo(np.uint64).max
        self.a = (rng.integers(1, hi, size=num_perm, dtype=np.uint64, endpoint=True) | 1)[:, None]
        self.b = rng.integers(0, hi, size=num_perm, dtype=np.uint64, endpoint=True)[:, None]

    def signatures(self, normalised_texts: Sequence[str]) -> np.ndarray:
        """uint32 signatures (n, num_perm); a text without shingles gets all 0xFFFFFFFF."""
        n = len(normalised_texts)
        sigs = np.full((n, self.num_perm), _EMPTY, dtype=np.uint32)
        hashes: list[int] = []
        owners: list[int] = []  # document of each shingle, in order
        for i, text in enumerate(normalised_texts):
            hs = shingle_hashes(text, self.ngram)
            hashes.extend(hs)
            owners.extend([i] * len(hs))
        if not hashes:
            return sigs
        x = np.array(hashes, dtype=np.uint64)
        doc = np.array(owners, dtype=np.int64)
        buf = np.empty((self.num_perm, min(_BLOCK, len(x))), dtype=np.uint64)
        start = 0
        while start < len(x):
            # Cut blocks at document boundaries where possible so most documents are reduced once;
            # a document spanning blocks is reduced per block and combined with np.minimum.
            stop = min(start + _BLOCK, len(x))
            xs, ds = x[start:stop], doc[start:stop]
            out = buf[:, : stop - start]
            np.multiply(self.a, xs[None, :], out=out)  # wraps mod 2^64 on purpose
            np.add(out, self.b, out=out)
            bounds = np.flatnonzero(np.diff(ds)) + 1
            firsts = np.concatenate(([0], bounds))
            mins = np.minimum.reduceat(out, firsts, axis=1)  # (num_perm, docs in block)
            top = (mins >> np.uint64(32)).astype(np.uint32).T  # (docs in block, num_perm)
            rows = ds[firsts]
            np.minimum(sigs[rows], top, out=top)
            sigs[rows] = top
            start = stop
        return sigs


def estimate(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Jaccard similarity estimated as the share of equal signature positions."""
    return float(np.count_nonzero(sig_a == sig_b)) / sig_a.shape[-1]
