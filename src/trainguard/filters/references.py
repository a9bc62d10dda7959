"""Dangling references: 'see Table 2' or 'Fig. 3' where the table or figure is not in the text.

Text extraction (HTML or PDF to text) often strips tables and figures but keeps the prose that
points at them. A mention is dangling when the document has no caption line for that number
('Table 2:', '**Figure 3.**', 'Fig. 3 -') and, when it has no numbered captions of that kind at
all, no uncaptioned element either: for tables a markdown table, an ASCII/RST grid, an HTML
<table> or LaTeX tabular; for figures a markdown or HTML image, or a LaTeX figure.
"""

from __future__ import annotations

import re

from trainguard.filters.base import Doc, FilterConfig, Flag

_NUM = r"(?P<num>\d+|[IVXL]+)(?![\w])"
_KIND = r"(?P<kind>Tables?|Tab\.|Figures?|Figs?\.)"
_MENTION = re.compile(rf"\b{_KIND}[ \t]*(?:~|\s)?{_NUM}", re.IGNORECASE)
# A caption: the mention at the start of a line (after markup), followed by punctuation.
_CAPTION = re.compile(
    rf"^[ \t>#*_|]*{_KIND}[ \t]*{_NUM}[a-z]?[ \t]*(?:\*\*|__|\*|_)?[ \t]*[:.|\-–—]",
    re.IGNORECASE | re.MULTILINE,
)
# "Table 2 of [12]", "Figure 3 in Smith et al.": the reader can follow that to another document.
_ELSEWHERE = re.compile(r"[a-z]?[ \t]+(?:of|in|from)[ \t]+(?:\[|\(|ref|[A-Z])")
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


def _key(num: str) -> str:
    return num.upper()


def dangling_references(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D240: each mention of a table or figure the document does not contain."""
    text = doc.text
    captions: dict[str, set[str]] = {"table": set(), "figure": set()}
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
        if num.isalpha() and not (num.isupper() and kind_word[0].isupper()):
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
