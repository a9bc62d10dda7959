"""Repetition within a document (Gopher repetition removal, Rae et al. 2021, table A1).

Thresholds (fractions above which a document is removed):
  duplicate line fraction 0.30, duplicate paragraph fraction 0.30,
  duplicate line character fraction 0.20, duplicate paragraph character fraction 0.20,
  top 2/3/4-gram character fraction 0.20/0.18/0.16,
  duplicate 5/6/7/8/9/10-gram character fraction 0.15/0.14/0.13/0.12/0.11/0.10.
"Duplicate" means an occurrence after the first; the n-gram fractions are over the characters of
the words (whitespace excluded), as in Gopher.
"""

from __future__ import annotations

from collections import Counter

from trainguard.filters.base import Doc, FilterConfig, Flag, merge_spans


def _duplicates(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans whose (stripped) content already occurred earlier."""
    seen: set[str] = set()
    dups = []
    for a, b in spans:
        key = text[a:b].strip()
        if key in seen:
            dups.append((a, b))
        else:
            seen.add(key)
    return dups


def _block_rule(
    doc: Doc, spans: list[tuple[int, int]], code: str, unit: str, max_frac: float, max_chars: float
) -> list[Flag]:
    if len(spans) < 2:
        return []
    dups = _duplicates(doc.text, spans)
    if not dups:
        return []
    frac = len(dups) / len(spans)
    total = sum(b - a for a, b in spans)
    char_frac = sum(b - a for a, b in dups) / total if total else 0.0
    if frac <= max_frac and char_frac <= max_chars:
        return []
    msg = (
        f"{len(dups)} of {len(spans)} {unit}s repeat an earlier one "
        f"({frac:.0%} of {unit}s, {char_frac:.0%} of characters)"
    )
    return [Flag(code, a, b, msg) for a, b in dups]


def repeated_lines(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D220: too many duplicate lines, by count or by characters."""
    flags = _block_rule(
        doc,
        doc.line_spans,
        "D220",
        "line",
        cfg.max_dup_line_fraction,
        cfg.max_dup_line_char_fraction,
    )
    return flags[: cfg.max_spans]


def repeated_paragraphs(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D221: too many duplicate paragraphs, by count or by characters."""
    flags = _block_rule(
        doc,
        doc.paragraph_spans,
        "D221",
        "paragraph",
        cfg.max_dup_para_fraction,
        cfg.max_dup_para_char_fraction,
    )
    return flags[: cfg.max_spans]


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def top_ngram(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D222: the most frequent short n-gram covers too many of the word characters."""
    words = doc.words
    total = sum(len(w) for w in words)
    for n, max_frac in sorted(cfg.max_top_ngram_char_fraction.items()):
        grams = _ngrams(words, n)
        if not grams:
            continue
        gram, count = Counter(grams).most_common(1)[0]
        if count < 2:
            continue
        frac = count * sum(len(w) for w in gram) / total
        if frac <= max_frac:
            continue
        msg = (
            f"the {n}-gram {' '.join(gram)!r} occurs {count} times and covers "
            f"{frac:.0%} of the characters (maximum {max_frac:.0%})"
        )
        spans = [
            (doc.word_spans[i][0], doc.word_spans[i + n - 1][1])
            for i, g in enumerate(grams)
            if g == gram
        ]
        return [Flag("D222", a, b, msg) for a, b in merge_spans(spans)[: cfg.max_spans]]
    return []


def duplicate_ngrams(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D223: repeated occurrences of long n-grams cover too many of the word characters."""
    words = doc.words
    total = sum(len(w) for w in words)
    for n, max_frac in sorted(cfg.max_dup_ngram_char_fraction.items()):
        if len(words) < 2 * n:
            continue
        dup = _repeated_word_mask(words, n)
        frac = sum(len(w) for w, d in zip(words, dup, strict=True) if d) / total
        if frac <= max_frac:
            continue
        msg = f"repeated {n}-grams cover {frac:.0%} of the characters (maximum {max_frac:.0%})"
        spans = merge_spans([s for s, d in zip(doc.word_spans, dup, strict=True) if d])
        return [Flag("D223", a, b, msg) for a, b in spans[: cfg.max_spans]]
    return []


def _repeated_word_mask(words: list[str], n: int) -> list[bool]:
    """Words inside an occurrence of an n-gram that already occurred earlier in the text."""
    seen: set[tuple[str, ...]] = set()
    mask = [False] * len(words)
    for i in range(len(words) - n + 1):
        gram = tuple(words[i : i + n])
        if gram in seen:
            for j in range(i, i + n):
                mask[j] = True
        else:
            seen.add(gram)
    return mask
