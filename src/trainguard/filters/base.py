"""What every filter rule shares: the flag it returns, its thresholds, and a cached view of a text.

A rule is a pure function `(Doc, FilterConfig) -> list[Flag]`: an empty list keeps the document,
any flag rejects it. Flags carry character spans so that `data inspect` can highlight exactly what
a rule objected to; a document-level verdict (too short) spans the whole text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Flag:
    """One objection of one rule: `code` (D210-D299, codes/data/), `[start, end)` in the text."""

    code: str
    start: int
    end: int
    message: str

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "start": self.start, "end": self.end, "message": self.message}


@dataclass
class FilterConfig:
    """Thresholds. Defaults are Gopher's (Rae et al. 2021, appendix A.1.1, table A1)."""

    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    min_alpha_word_fraction: float = 0.8
    max_bullet_line_fraction: float = 0.9
    max_ellipsis_line_fraction: float = 0.3
    max_dup_line_fraction: float = 0.3
    max_dup_para_fraction: float = 0.3
    max_dup_line_char_fraction: float = 0.2
    max_dup_para_char_fraction: float = 0.2
    # n -> max fraction of word characters covered by the most frequent n-gram.
    max_top_ngram_char_fraction: dict[int, float] = field(
        default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16}
    )
    # n -> max fraction of word characters covered by repeated occurrences of n-grams.
    max_dup_ngram_char_fraction: dict[int, float] = field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
    )
    # Spans listed per flag family at most; the verdict uses all of them.
    max_spans: int = 50


class Doc:
    """A text with its words, lines and paragraphs computed once and shared by all rules."""

    def __init__(self, text: str) -> None:
        self.text = text

    @cached_property
    def word_spans(self) -> list[tuple[int, int]]:
        return [m.span() for m in _WORD.finditer(self.text)]

    @cached_property
    def words(self) -> list[str]:
        return [self.text[a:b] for a, b in self.word_spans]

    @cached_property
    def line_spans(self) -> list[tuple[int, int]]:
        """Non-blank lines as (start, end) without the newline."""
        spans, pos = [], 0
        for line in self.text.split("\n"):
            if line.strip():
                spans.append((pos, pos + len(line)))
            pos += len(line) + 1
        return spans

    @cached_property
    def paragraph_spans(self) -> list[tuple[int, int]]:
        """Blocks separated by one or more blank lines."""
        return [m.span() for m in re.finditer(r"\S(?:.|\n(?![ \t]*\n))*", self.text) if m.group()]


def merge_spans(spans: list[tuple[int, int]], gap: int = 1) -> list[tuple[int, int]]:
    """Sorted spans with neighbours closer than `gap` characters joined, for compact highlights."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1] + gap:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
