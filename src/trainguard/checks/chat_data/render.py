"""Renderings of one example as token ids, and where each message's content lies in them.

A rendering is a string encoded with character offsets when there is one (a template's output,
a `text` column), so that each message's content is found by its characters and mapped to the
tokens that cover them; pre-tokenized `input_ids` borrow the spans of a rendering they equal.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

ROLE_PROMPT = ("system", "user", "tool")  # turns whose tokens must carry no loss


@dataclass
class Rendered:
    ids: list[int]
    text: str | None = None
    offsets: list[tuple[int, int]] | None = None
    source: str = ""  # "input_ids column", "text column", "--template", "chat template"
    mask: list[int] | None = None  # assistant tokens by the template's {% generation %} tags


@dataclass
class Span:
    """Message `index` (role) covers tokens [start, end); `eot` is the end-of-turn token after
    it (None: none follows)."""

    index: int
    role: str
    start: int
    end: int
    eot: int | None = None


def render(tok: Any, messages: list[dict[str, str]], template: str | None) -> str:
    """The template's string for the whole conversation (no generation prompt: the training
    view). jinja2's TemplateError when the template refuses it."""
    return tok.apply_chat_template(messages, chat_template=template, tokenize=False)


def encode(tok: Any, text: str, source: str, add_special_tokens: bool = False) -> Rendered:
    enc = tok(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    return Rendered(list(enc["input_ids"]), text, offsets, source)  # type: ignore[arg-type]


def generation_mask(tok: Any, messages: list[dict[str, str]], template: str) -> list[int] | None:
    """The template's assistant mask (`return_assistant_tokens_mask`), or None when the
    template has no `{% generation %}` block."""
    out = tok.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    mask = out.get("assistant_masks")
    return None if mask is None else list(mask)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where `a` and `b` differ (the shorter's length when one is a
    prefix of the other); None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def token_text(tok: Any, ids: list[int], position: int) -> str:
    """The token at `position`, decoded and quoted; "(end)" past the last one."""
    if position >= len(ids):
        return "(end)"
    return repr(tok.decode([ids[position]], skip_special_tokens=False))


def message_spans(r: Rendered, messages: list[dict[str, str]], special: set[int]) -> list[Span]:
    """Each message found in order in the rendering's text (its content, stripped, as templates
    often trim it), as a token range; messages not found (empty, or rewritten by the template)
    are left out. `special`: the ids that can end a turn (the tokenizer's special tokens)."""
    if r.text is None or r.offsets is None:
        return []
    spans: list[Span] = []
    cursor = 0
    # Running maximum of the token ends, for bisect (a post-processor's EOS has offsets (0, 0)).
    ends = list(accumulate((e for _, e in r.offsets), max))
    for i, m in enumerate(messages):
        content = m["content"].strip()
        if not content:
            continue
        at = r.text.find(content, cursor)
        if at < 0:
            continue
        a, b = at, at + len(content)
        cursor = b
        # The tokens overlapping [a, b): from the first ending after a (bisect: long
        # conversations have thousands of tokens per message).
        first = bisect_right(ends, a)
        toks = []
        for t in range(first, len(r.offsets)):
            s, e = r.offsets[t]
            if s >= b:
                break
            if e > s:  # special tokens a post-processor adds have empty offsets
                toks.append(t)
        if toks:
            spans.append(Span(i, m["role"], toks[0], toks[-1] + 1))
    for k, s in enumerate(spans):
        stop = spans[k + 1].start if k + 1 < len(spans) else len(r.ids)
        # The turn's end marker follows the content at once, or after one newline-like token.
        for t in range(s.end, min(s.end + 2, stop)):
            if r.ids[t] in special:
                s.eot = t
                break
    return spans
