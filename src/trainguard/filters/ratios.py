"""Symbol and alphabetic ratios, bullet and ellipsis lines (Gopher quality filter, Rae et al. 2021).

Gopher removes documents with a symbol-to-word ratio above 0.1 for the hash symbol or the
ellipsis, with fewer than 80% of words containing an alphabetic character, with more than 90% of
lines starting with a bullet point, or more than 30% ending with an ellipsis.
"""

from __future__ import annotations

import re

from trainguard.filters.base import Doc, FilterConfig, Flag

_SYMBOL = re.compile(r"#|\.\.\.|…")
# No "^": Pattern.match(text, pos) anchors at pos itself.
_BULLET = re.compile(r"\s*[•●○▪▫■□◦‣∙·\-–—*]\s")
_ELLIPSIS_END = re.compile(r"(?:\.\.\.|…)\s*$")


def symbol_ratio(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D213: more than `max_symbol_word_ratio` '#' or ellipses per word."""
    if not doc.words:
        return []
    hits = [m.span() for m in _SYMBOL.finditer(doc.text)]
    ratio = len(hits) / len(doc.words)
    if ratio <= cfg.max_symbol_word_ratio:
        return []
    msg = f"{len(hits)} '#'/ellipsis for {len(doc.words)} words (ratio {ratio:.2f})"
    return [Flag("D213", a, b, msg) for a, b in hits[: cfg.max_spans]]


def alphabetic_words(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D214: fewer than `min_alpha_word_fraction` of words hold an alphabetic character."""
    if not doc.words:
        return []
    bad = [s for s, w in zip(doc.word_spans, doc.words, strict=True) if not _has_alpha(w)]
    frac = 1.0 - len(bad) / len(doc.words)
    if frac >= cfg.min_alpha_word_fraction:
        return []
    msg = f"only {frac:.0%} of words are alphabetic (minimum {cfg.min_alpha_word_fraction:.0%})"
    return [Flag("D214", a, b, msg) for a, b in bad[: cfg.max_spans]]


def _has_alpha(word: str) -> bool:
    return any(c.isalpha() for c in word)


def bullet_ellipsis_lines(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D215: nearly all lines are bullets, or many lines end in an ellipsis."""
    lines = doc.line_spans
    if not lines:
        return []
    text = doc.text
    bullets = [(a, b) for a, b in lines if _BULLET.match(text, a, b)]
    ellipses = [(a, b) for a, b in lines if _ELLIPSIS_END.search(text[a:b])]
    flags: list[Flag] = []
    if len(bullets) / len(lines) > cfg.max_bullet_line_fraction:
        msg = f"{len(bullets)} of {len(lines)} lines start with a bullet"
        flags += [Flag("D215", a, b, msg) for a, b in bullets[: cfg.max_spans]]
    if len(ellipses) / len(lines) > cfg.max_ellipsis_line_fraction:
        msg = f"{len(ellipses)} of {len(lines)} lines end with an ellipsis"
        flags += [Flag("D215", a, b, msg) for a, b in ellipses[: cfg.max_spans]]
    return flags
