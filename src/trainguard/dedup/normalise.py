"""Text normalisation for exact duplicates: Unicode NFC, case folding, whitespace collapsed.

Two documents whose normalised texts are equal are exact duplicates. The normalised text is also
what the MinHash shingles are cut from, so near-duplicate detection ignores the same differences.
"""

from __future__ import annotations

import unicodedata

import xxhash


def normalise(text: str) -> str:
    """NFC, then case folding, then every run of whitespace as one space, no leading/trailing."""
    if not text.isascii():
        # Case folding can decompose (e.g. U+0130), so compose again after it.
        text = unicodedata.normalize("NFC", unicodedata.normalize("NFC", text).casefold())
    else:
        text = text.lower()  # for ASCII, casefold() == lower() and lower() is faster
    return " ".join(text.split())


def exact_key(normalised: str) -> int:
    """A 128-bit xxh3 hash of the normalised text: collisions are negligible at web scale.
    Text that is not valid Unicode (surrogates, `data/corpus.py`) hashes its surrogates as is."""
    return xxhash.xxh3_128_intdigest(normalised.encode("utf-8", "surrogatepass"))
