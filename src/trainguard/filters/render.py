"""Turn flagged documents into highlighted text: rich renderables and a self-contained HTML page.

Pure: builds strings and renderables, prints nothing (only the CLI prints).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from trainguard.filters.base import Flag
from trainguard.filters.inspection import Inspection
from trainguard.filters.registry import RULES

# One colour per rule family: length/ratios, repetition, encoding, references.
_FAMILY_RICH = {"D21": "black on yellow", "D22": "black on magenta", "D23": "white on red"}
_FAMILY_CSS = {"D21": "#ffe066", "D22": "#e599f7", "D23": "#ff8787", "D24": "#66d9e8"}
_INVISIBLE = re.compile(
    "[\ud800-\udfff\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\u202a-\u202e\u2060\u2066-\u2069\ufeff]"
)


def _rich_style(code: str) -> str:
    return _FAMILY_RICH.get(code[:3], "black on cyan")


def visible(text: str) -> str:
    """Make invalid bytes and invisible characters visible (and printable): <xNN>, <U+XXXX>."""

    def show(m: re.Match[str]) -> str:
        c = ord(m.group())
        return f"<x{c - 0xDC00:02X}>" if 0xDC80 <= c <= 0xDCFF else f"<U+{c:04X}>"

    return _INVISIBLE.sub(show, text)


def segments(
    text: str, flags: list[Flag], limit: int | None = None
) -> Iterator[tuple[str, list[Flag]]]:
    """The text cut at every span boundary, each piece with the flags covering it."""
    end = len(text) if limit is None else min(len(text), limit)
    cuts = {0, end}
    for f in flags:
        cuts.update(x for x in (f.start, f.end) if 0 <= x <= end)
    points = sorted(cuts)
    for a, b in zip(points, points[1:], strict=False):
        if a < b:
            yield text[a:b], [f for f in flags if f.start <= a and b <= f.end]


def rich_sample(title: str, text: str, flags: list[Flag], max_chars: int) -> Panel:
    body = Text()
    for piece, cover in segments(text, flags, max_chars):
        body.append(visible(piece), style=_rich_style(cover[0].code) if cover else "")
    if len(text) > max_chars:
        body.append(f"\n... ({len(text) - max_chars} more characters)", style="dim")
    reasons = Text()
    for code in sorted({f.code for f in flags}):
        msg = next(f.message for f in flags if f.code == code)
        reasons.append(f"\n{code}", style=_rich_style(code))
        reasons.append(f" {msg}")
    # A str title is read as markup by Panel; the title quotes a document id.
    return Panel(Group(body, reasons) if flags else body, title=Text(title), title_align="left")


def counts_table(insp: Inspection) -> Table:
    table = Table(title=f"rule counts over {insp.total} documents ({insp.flagged} flagged)")
    for col in ("code", "rule", "documents", "share"):
        table.add_column(col)
    for rule in RULES:
        for code in rule.codes:
            n = insp.by_code.get(code, 0)
            share = f"{n / insp.total:.1%}" if insp.total else "-"
            table.add_row(
                Text(code, style=_rich_style(code) if n else ""), rule.name, str(n), share
            )
    return table


def render_html(insp: Inspection, source: str, max_chars: int = 20_000) -> str:
    """A self-contained page (inline CSS, no scripts): counts, legend, highlighted samples."""
    esc = html.escape
    css = "\n".join(f"mark.{fam} {{ background: {color}; }}" for fam, color in _FAMILY_CSS.items())
    rows = "".join(
        f"<tr><td><mark class='{c[:3]}'>{c}</mark></td><td>{esc(r.name)}</td>"
        f"<td>{esc(r.description)}</td><td>{insp.by_code.get(c, 0)}</td></tr>"
        for r in RULES
        for c in r.codes
    )
    samples = []
    for s in insp.samples:
        parts = []
        for piece, cover in segments(s.record.text, s.flags, max_chars):
            shown = esc(visible(piece))
            if cover:
                tip = esc("; ".join(f"{f.code}: {f.message}" for f in cover), quote=True)
                parts.append(f"<mark class='{cover[0].code[:3]}' title=\"{tip}\">{shown}</mark>")
            else:
                parts.append(shown)
        if len(s.record.text) > max_chars:
            parts.append(f"<i>... ({len(s.record.text) - max_chars} more characters)</i>")
        why = "".join(
            f"<li><mark class='{c[:3]}'>{c}</mark> "
            f"{esc(next(f.message for f in s.flags if f.code == c))}</li>"
            for c in sorted({f.code for f in s.flags})
        )
        samples.append(
            f"<section><h3>#{s.index} {esc(visible(s.record.id))}</h3>"
            f"<ul>{why or '<li>no rule flags this document</li>'}</ul>"
            f"<pre>{''.join(parts)}</pre></section>"
        )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>trainguard data inspect: {esc(source)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 72em; }}
pre {{ white-space: pre-wrap; background: #f8f9fa; padding: 1em; border: 1px solid #dee2e6; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #dee2e6; padding: 0.2em 0.6em; }}
{css}
</style></head><body>
<h1>data inspect: {esc(source)}</h1>
<p>{insp.total} documents, {insp.flagged} flagged by at least one rule;
{len(insp.samples)} random samples below. Hover a highlight for its reason.</p>
<table><tr><th>code</th><th>rule</th><th>what</th><th>documents</th></tr>{rows}</table>
{"".join(samples)}
</body></html>
"""
