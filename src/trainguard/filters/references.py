"""Dangling references: 'see Table 2' or 'Fig. 3' where the table or figure is not in the text.

Text extraction (HTML or PDF to text) often strips tables and figures but keeps the prose that
points at them. A mention is dangling when the document has no caption line for that number
('Table 2:', '**Figure 3.**', 'Fig. 3 -') and, when it has no numbered captions of that kind at
all, no uncaptioned element either: for tables a markdown table, an ASCII/RST grid, an HTML
<table> or LaTeX tabular; for figures a markdown or HTML image, or a LaTeX figure.

Numbers are digits, roman numerals (after a capitalised 'Table'/'Figure') or spelled out
('table one', 'see figure three'), all compared by value ('Table One' is captioned by 'Table 1:').
"table" and "figure" are also verbs ('we table one motion', 'figure two things out'), so a
spelled-out number counts only when what follows it ends the reference: punctuation, the end of
the text, or a word that cannot be the noun the number counts ('shows', 'for', 'and', ...).
"""

from __future__ import annotations

import re

from trainguard.filters.base import Doc, FilterConfig, Flag

# fmt: off
_WORDS = (
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
    "twenty",
)
# fmt: on
_WORD_VALUE = {w: i for i, w in enumerate(_WORDS, start=1)}
_ROMAN = {"I": 1, "V": 5, "X": 10, "L": 50}
_NUM = rf"(?P<num>\d+|[IVXL]+|{'|'.join(sorted(_WORDS, key=len, reverse=True))})(?![\w])"
_KIND = r"(?P<kind>Tables?|Tab\.|Figures?|Figs?\.)"
_MENTION = re.compile(rf"\b{_KIND}[ \t]*(?:~|\s)?{_NUM}", re.IGNORECASE)
# A caption: the mention at the start of a line (after markup), followed by punctuation.
_CAPTION = re.compile(
    rf"^[ \t>#*_|]*{_KIND}[ \t]*{_NUM}[a-z]?[ \t]*(?:\*\*|__|\*|_)?[ \t]*[:.|\-–—]",
    re.IGNORECASE | re.MULTILINE,
)
# "Table 2 of [12]", "Figure 3 in Smith et al.": the reader can follow that to another document.
_ELSEWHERE = re.compile(r"[a-z]?[ \t]+(?:of|in|from)[ \t]+(?:\[|\(|ref|[A-Z])")
# After a spelled-out number: what ends a reference ('see table one.', 'figure three shows').
# Anything else ('figure two things out', 'table one motion') reads as a quantity.
_WORD_REF_END = re.compile(
    r"\s*(?:$|[.,;:!?)\]\n]|(?:and|or|for|in|on|at|to|as|is|was|are|were|has|had|shows?|showed|"
    r"lists?|gives?|gave|summari[sz]es|summari[sz]ed|presents?|illustrates?|compares?|reports?|"
    r"contains?|depicts?|displays?|plots?|describes?|above|below|again|also|we|the|where|which|"
    r"that|but|with)\b)",
    re.IGNORECASE,
)
_TABLE_BLOCK = re.compile(
    r"^[ \t]*\|?[ \t]*:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*)+\|?[ \t]*$"  # markdown separator
    r"|^[ \t]*\+(?:[-=]{3,}\+)+[ \t]*$"  # ASCII grid
    r"|^[ \t]*={3,}(?:[ \t]+={3,})+[ \t]*$"  # RST simple table
    r"|<table\b|\\begin\{(?:table|tabular)",
    re.IGNORECASE | re.MULTILINE,
)
_FIGURE_BLOCK = re.compile(
    r"!\[[^\]]*\]\([^)]*\)|<img\b|<figure\b|\\begin\{figure\}|\\includegraphics", re.IGNORECASE
)


def _kind_of(word: str) -> str:
    return "table" if word.lower().startswith("tab") else "figure"


def _key(num: str) -> int:
    """The number's value: '3', 'III' and 'three' are the same table."""
    if num.isdigit():
        return int(num)
    if num.lower() in _WORD_VALUE:
        return _WORD_VALUE[num.lower()]
    values = [_ROMAN[c] for c in num.upper()]
    # Subtractive notation: a smaller numeral before a larger one is subtracted (IV = 4).
    return sum(-v if i + 1 < len(values) and v < values[i + 1] else v for i, v in enumerate(values))


def dangling_references(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D240: each mention of a table or figure the document does not contain."""
    text = doc.text
    captions: dict[str, set[int]] = {"table": set(), "figure": set()}
    caption_starts: set[int] = set()
    for m in _CAPTION.finditer(text):
        captions[_kind_of(m.group("kind"))].add(_key(m.group("num")))
        caption_starts.add(m.start("kind"))
    has_block = {
        "table": _TABLE_BLOCK.search(text) is not None,
        "figure": _FIGURE_BLOCK.search(text) is not None,
    }
    flags = []
    for m in _MENTION.finditer(text):
        if m.start("kind") in caption_starts:
            continue  # the caption itself
        kind_word, num = m.group("kind"), m.group("num")
        if num.lower() in _WORD_VALUE:
            if not _WORD_REF_END.match(text, m.end()):
                continue  # "figure two things out": a quantity, not a reference
        elif num.isalpha() and not (num.isupper() and kind_word[0].isupper()):
            continue  # "the table I made": a roman numeral only after a capitalised "Table"
        if _ELSEWHERE.match(text, m.end()):
            continue
        kind = _kind_of(kind_word)
        if _key(num) in captions[kind]:
            continue
        if not captions[kind] and has_block[kind]:
            continue  # uncaptioned tables/figures: assume the mention points at one of them
        where = "caption" if captions[kind] else f"caption or {kind}"
        msg = f"mentions {kind_word} {num} but the document has no such {where}"
        flags.append(Flag("D240", m.start(), m.end(), msg))
    return flags[: cfg.max_spans]
