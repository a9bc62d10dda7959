"""Encoding defects: invalid UTF-8, replacement characters, control and invisible characters.

Readers in this package decode bytes with `surrogateescape`, so each invalid byte survives as a
lone surrogate U+DC80..U+DCFF at its place in the text: the rule can point at it, and writing the
document back restores the original bytes.
"""

from __future__ import annotations

import re

from trainguard.filters.base import Doc, FilterConfig, Flag, merge_spans

_SURROGATE = re.compile(r"[\ud800-\udfff]+")
_REPLACEMENT = re.compile(r"\ufffd+")
# C0 controls except \t \n \r, DEL and C1 controls, zero-width space, bidi embeddings/overrides
# and isolates (the "Trojan Source" characters), word joiner, and the BOM/zero-width no-break
# space. Zero-width (non-)joiners U+200C/U+200D are left alone: scripts and emoji need them.
_CONTROL = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\u202a-\u202e\u2060\u2066-\u2069\ufeff]+"
)


def _spans_of(pattern: re.Pattern[str], text: str) -> list[tuple[int, int]]:
    return [m.span() for m in pattern.finditer(text)]


def invalid_utf8(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D230: bytes that were not UTF-8 (surrogate escapes) or lone surrogates."""
    spans = _spans_of(_SURROGATE, doc.text)
    if not spans:
        return []
    n = sum(b - a for a, b in spans)
    msg = f"{n} invalid UTF-8 byte(s) or lone surrogate(s)"
    return [Flag("D230", a, b, msg) for a, b in spans[: cfg.max_spans]]


def replacement_chars(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D231: U+FFFD left by an earlier lossy decode."""
    spans = _spans_of(_REPLACEMENT, doc.text)
    if not spans:
        return []
    n = sum(b - a for a, b in spans)
    msg = f"{n} U+FFFD replacement character(s): an earlier decode lost the original text"
    return [Flag("D231", a, b, msg) for a, b in spans[: cfg.max_spans]]


def control_chars(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D232: control characters and invisible format characters."""
    spans = merge_spans(_spans_of(_CONTROL, doc.text), gap=0)
    if not spans:
        return []
    names = sorted({f"U+{ord(c):04X}" for a, b in spans for c in doc.text[a:b]})
    msg = f"control/invisible characters {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
    return [Flag("D232", a, b, msg) for a, b in spans[: cfg.max_spans]]
