"""One bounded parser for a line of a JSON Lines metric log, shared by every reader of one.

A metric log is read by `report`, `batch`, `reference record`, `watch` and a resuming `run`;
a damaged or hostile line must never become a traceback in any of them. `parse_row` turns a
line into a dict or raises `RowRejected` saying why:

- a line longer than `MAX_LINE_CHARS` is rejected before it is parsed (parsing cost is bounded);
- nesting deeper than `MAX_DEPTH` is rejected: the C parser's own recursion limit becomes a
  rejection, and a shallower but still deep value is measured (without recursion) after
  parsing, so that no later recursive walk (plots, JSON output, YAML) can overflow the stack;
- an integer too long to fit a float (a 400-digit number) becomes +-inf, a non-finite value
  the checks already flag (R101), instead of an OverflowError wherever it is turned into a
  float; `1e400` is already inf in JSON;
- anything but a JSON object is rejected (every reader does `row.get(...)`).

`iter_rows` walks a whole log: each line's row or rejection with its line number, and a last
line without its newline that does not parse (a write cut by a crash or still under way) is
skipped silently.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

MAX_LINE_CHARS = 1 << 20  # 1 MiB: the largest trainguard row (a finding's data) is a few kB
MAX_DEPTH = 64  # trainguard's rows nest 4 deep (a finding's data); other trainers' rows less
_MAX_INT_DIGITS = 308  # every integer of up to 308 digits is below the largest float (1.8e308)


class RowRejected(ValueError):
    """A line that is not a usable row; `reason` says why (no path or line number)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _int(text: str) -> int | float:
    digits = len(text) - (text[0] == "-")
    if digits > _MAX_INT_DIGITS:
        return -math.inf if text[0] == "-" else math.inf
    return int(text)


def _too_deep(value: Any) -> bool:
    """Whether `value` nests more than MAX_DEPTH containers (an explicit stack, no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, list):
            continue
        if depth > MAX_DEPTH:
            return True
        stack.extend((x, depth + 1) for x in v if isinstance(x, dict | list))
    return False


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _lone_surrogate(row: dict[str, Any]) -> bool:
    """True when a key or string holds half of a surrogate pair: json.loads decodes a lone
    `\\ud800` escape to a string that no UTF-8 file, report or terminal can hold."""
    stack: list[Any] = [row]
    while stack:
        v = stack.pop()
        items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
        for x in items:
            if isinstance(x, str):
                try:
                    x.encode("utf-8")
                except UnicodeEncodeError:
                    return True
            elif isinstance(x, dict | list):
                stack.append(x)
    return False


def parse_row(line: str) -> dict[str, Any]:
    """The JSON object on `line`; RowRejected when the line is not one (see the module)."""
    if len(line) > MAX_LINE_CHARS:
        raise RowRejected(f"the line is longer than {MAX_LINE_CHARS} characters")
    try:
        row = json.loads(line, parse_int=_int)
    except RecursionError:
        raise RowRejected(f"values nest deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as e:
        raise RowRejected(f"not valid JSON ({e.msg})") from None
    except ValueError as e:  # e.g. an integer literal too long to convert
        raise RowRejected(f"not valid JSON ({e})") from None
    if not isinstance(row, dict):
        raise RowRejected("not a JSON object")
    # Only a line with enough brackets can nest that deep: most rows skip the walk.
    if line.count("[") + line.count("{") > MAX_DEPTH and _too_deep(row):
        raise RowRejected(f"values nest deeper than {MAX_DEPTH} levels")
    # Only a line with a surrogate escape can decode to one: most rows skip the walk.
    if _SURROGATE_ESCAPE.search(line) and _lone_surrogate(row):
        raise RowRejected("a string holds a lone surrogate (\\ud800-\\udfff), not valid Unicode")
    return row


def iter_rows(text: str) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """(line number, row, None) for each row of `text`, (line number, None, reason) for each
    rejected line; blank lines and a torn last line (no newline, not parseable) are left out."""
    # Split at "\n" only: str.splitlines also cuts at U+2028 and other separators that a JSON
    # string may hold raw.
    lines = text.split("\n")
    torn_possible = lines[-1] != ""
    if not torn_possible:
        lines.pop()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield i, parse_row(line), None
        except RowRejected as e:
            if torn_possible and i == len(lines):
                return  # a write cut by a crash, or still under way
            yield i, None, e.reason
