"""Generated eval tasks. `python_next_line`: the default recipe's use-case eval.

Given the lines of held-out Python code before a position, choose the true next line among
distractor lines drawn from *other* validation documents. The distractors are re-indented to
the true line's indentation, so indentation alone never gives the answer away.

The split point follows the lint's rules (no trailing-space trap, no boundary mismatch): the
context ends at the end of a line *without* its newline, and every choice starts with the
newline and indentation, which a byte-level BPE pre-tokenises on its own.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable
from typing import Any

from trainguard.errors import BadInputError

MIN_LINE_CHARS = 12  # shorter lines ("else:", "pass", ")") are too easy to guess or to confuse
CONTEXT_LINES = 8
CONTEXT_CHARS = 600


def _candidate_lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.splitlines()]


def _good(line: str) -> bool:
    body = line.strip()
    return len(body) >= MIN_LINE_CHARS and not body.startswith("#")


def build_next_line_examples(
    docs: Iterable[tuple[str, str]],
    *,
    n_examples: int = 200,
    n_choices: int = 4,
    seed: int = 0,
    per_doc: int | None = None,
) -> list[dict[str, Any]]:
    """Multiple-choice rows {"context", "choices", "gold", "doc"} from (doc id, text) pairs.

    Deterministic for the same documents and seed: documents are sorted by id, and one seeded
    RNG picks positions, distractors and the gold slot.
    """
    rng = random.Random(seed)
    docs = sorted(docs)
    lines_by_doc = {doc_id: _candidate_lines(text) for doc_id, text in docs}
    pool = [(d, ln.strip()) for d, lines in lines_by_doc.items() for ln in lines if _good(ln)]
    if len({d for d, _ in pool}) < 2:
        raise BadInputError(
            "python_next_line needs at least two validation documents with code lines",
            "use a larger corpus or a larger data.val_fraction",
        )
    # Spread examples over documents: a few positions from each, enough to fill n_examples.
    per_doc = per_doc or max(2, -(-2 * n_examples // len(lines_by_doc)))
    candidates = []
    for doc_id, lines in lines_by_doc.items():
        spots = [i for i in range(1, len(lines)) if _good(lines[i]) and lines[i - 1].strip()]
        rng.shuffle(spots)
        candidates += [(doc_id, i) for i in sorted(spots[:per_doc])]
    rng.shuffle(candidates)
    rows = []
    for doc_id, i in candidates:
        if len(rows) >= n_examples:
            break
        lines = lines_by_doc[doc_id]
        true = lines[i]
        indent = true[: len(true) - len(true.lstrip())]
        context = "\n".join(lines[max(0, i - CONTEXT_LINES) : i])[-CONTEXT_CHARS:]
        distractors: list[str] = []
        seen = {true.strip()}
        for _ in range(50 * n_choices):
            if len(distractors) == n_choices - 1:
                break
            other_doc, body = pool[rng.randrange(len(pool))]
            if other_doc != doc_id and body not in seen:
                seen.add(body)
                distractors.append(indent + body)
        if len(distractors) < n_choices - 1:
            continue
        gold = rng.randrange(n_choices)
        choices = distractors[:gold] + [true] + distractors[gold:]
        rows.append(
            {
                "context": context,
                "choices": ["\n" + c for c in choices],
                "gold": gold,
                "doc": doc_id,
            }
        )
    return rows


@functools.lru_cache(maxsize=8)
def _val_docs(source: str, text_field: str, val_fraction: float) -> tuple[tuple[str, str], ...]:
    # Cached: the run evaluates every K steps and reading the corpus is the slow part.
    from trainguard.data.corpus import iter_documents, split_of

    return tuple(
        (d.id, d.text)
        for d in iter_documents(source, text_field)
        if split_of(d.id, val_fraction) == "val"
    )


def python_next_line(data: Any | None = None, **options: Any) -> list[dict[str, Any]]:
    """The task's rows from the validation split of `data` (a DataConfig; default stdlib)."""
    source = getattr(data, "source", "stdlib")
    text_field = getattr(data, "text_field", "text")
    val_fraction = getattr(data, "val_fraction", 0.05)
    allowed = {"n_examples", "n_choices", "seed", "per_doc"}
    unknown = set(options) - allowed
    if unknown:
        raise BadInputError(
            f"python_next_line has no options {sorted(unknown)}",
            f"allowed options: {sorted(allowed)}",
        )
    return build_next_line_examples(_val_docs(source, text_field, val_fraction), **options)


BUILTINS = {"python_next_line": ("multiple_choice", python_next_line)}


def builtin_rows(name: str, data: Any | None, options: dict[str, Any]) -> list[dict[str, Any]]:
    if name not in BUILTINS:
        raise BadInputError(f"unknown builtin eval task {name!r}", f"one of {sorted(BUILTINS)}")
    return BUILTINS[name][1](data, **options)
