"""The rules registry: every filter rule, its code, and how to run them over a document."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainguard.filters import encoding, length, ratios, references, repetition
from trainguard.filters.base import Doc, FilterConfig, Flag


@dataclass(frozen=True)
class Rule:
    """A named rule; `codes` lists every code it can return."""

    name: str
    codes: tuple[str, ...]
    check: Callable[[Doc, FilterConfig], list[Flag]]
    description: str


RULES: tuple[Rule, ...] = (
    Rule("word_count", ("D210", "D211"), length.word_count, "length bounds in words"),
    Rule("mean_word_length", ("D212",), length.mean_word_length, "mean word length bounds"),
    Rule("symbol_ratio", ("D213",), ratios.symbol_ratio, "'#' and ellipsis per word"),
    Rule("alphabetic_words", ("D214",), ratios.alphabetic_words, "share of alphabetic words"),
    Rule("bullet_ellipsis_lines", ("D215",), ratios.bullet_ellipsis_lines, "bullet/ellipsis lines"),
    Rule("repeated_lines", ("D220",), repetition.repeated_lines, "duplicate lines"),
    Rule("repeated_paragraphs", ("D221",), repetition.repeated_paragraphs, "duplicate paragraphs"),
    Rule("top_ngram", ("D222",), repetition.top_ngram, "most frequent 2-4-gram"),
    Rule("duplicate_ngrams", ("D223",), repetition.duplicate_ngrams, "repeated 5-10-grams"),
    Rule("invalid_utf8", ("D230",), encoding.invalid_utf8, "invalid UTF-8 bytes"),
    Rule("replacement_chars", ("D231",), encoding.replacement_chars, "U+FFFD characters"),
    Rule("control_chars", ("D232",), encoding.control_chars, "control/invisible characters"),
    Rule("dangling_references", ("D240",), references.dangling_references, "missing tables/figs"),
)

ALL_CODES: tuple[str, ...] = tuple(c for r in RULES for c in r.codes)


def select_rules(disabled: Iterable[str] = ()) -> tuple[Rule, ...]:
    """The rules left after disabling codes or rule names; unknown names raise ValueError."""
    disabled = {d.strip() for d in disabled if d.strip()}
    known = set(ALL_CODES) | {r.name for r in RULES}
    unknown = sorted(disabled - known)
    if unknown:
        raise ValueError(
            f"unknown filter rule(s) {unknown}; known codes {list(ALL_CODES)} and names "
            f"{[r.name for r in RULES]}"
        )
    return tuple(r for r in RULES if r.name not in disabled and not set(r.codes) <= disabled)


def apply_rules(
    text: str,
    config: FilterConfig | None = None,
    rules: Iterable[Rule] | None = None,
    disabled_codes: Iterable[str] = (),
) -> list[Flag]:
    """Every flag every rule raises on `text`, in text order. No flags: keep the document."""
    cfg = config or FilterConfig()
    off = set(disabled_codes)
    doc = Doc(text)
    flags: list[Flag] = []
    for rule in RULES if rules is None else rules:
        flags += [f for f in rule.check(doc, cfg) if f.code not in off]
    flags.sort(key=lambda f: (f.start, f.end, f.code))
    return flags


def reasons(flags: list[Flag]) -> list[dict[str, str]]:
    """One `{code, message}` per code, in code order: why a document was rejected."""
    first: dict[str, str] = {}
    for f in flags:
        first.setdefault(f.code, f.message)
    return [{"code": c, "message": first[c]} for c in sorted(first)]
