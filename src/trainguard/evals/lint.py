"""Eval template lint: the traps that turn a correct model's scores into noise.

With the recipe's tokenizer (the tokens the runner will score):
- E111 trailing-space trap: a context ending in whitespace whose continuation begins with
  whitespace; for generation, a prompt ending in a space or tab, judged by the tokenizer: in
  running text (prompt + answer) the model saw either the space as its own token before the
  answer (then the prompt needs it: the Falcon case) or the space inside the answer's first
  token (" Paris"; then the prompt's space leaves the model to produce "Paris" without it, a
  form it rarely saw). Only the second is a trap (error). Without a tokenizer the lint cannot
  tell, so a trailing space is a warning;
- E112 token boundary mismatch: encode(context) + encode(continuation) !=
  encode(context + continuation);
- E113 / E114 document-start token (BOS) missing or doubled;
- E115 empty choice, answer or text; E116 duplicate choices; E117 gold index out of range;
- E118 a regex answer (`match: regex`) that is not a valid regular expression.

One finding per task and code, counting the examples affected and naming the first, so a
10,000-example task with a systematic trap gives one line, not 10,000.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer

from trainguard.evals.scoring import encode_context, encode_continuation
from trainguard.evals.spec import (
    EvalSpec,
    TaskSpec,
    answer_error,
    gold_error,
    load_spec,
    task_rows,
)
from trainguard.findings import Finding

DOC_START = "<|endoftext|>"


class _Collector:
    def __init__(self, task: TaskSpec) -> None:
        self.task = task
        self.hits: dict[str, list[tuple[int, str, dict[str, Any]]]] = {}

    def add(self, code: str, index: int, detail: str, **data: Any) -> None:
        """`data` may hold `severity` to override the code's default for this hit."""
        hits = self.hits.setdefault(code, [])
        if not hits or hits[-1][0] != index:  # count examples, not choices
            hits.append((index, detail, data))

    def findings(self, where: str) -> list[Finding]:
        out = []
        for code, hits in sorted(self.hits.items()):
            index, detail, data = hits[0]
            data = dict(data)
            severity = data.pop("severity", None)
            more = f" (and {len(hits) - 1} more examples)" if len(hits) > 1 else ""
            out.append(
                Finding.of(
                    code,
                    f"task {self.task.name!r} example {index}: {detail}{more}",
                    where=where,
                    metric=self.task.name,
                    data={"examples": len(hits), "first": index, **data},
                    **({"severity": severity} if severity else {}),
                )
            )
        return out


def _pairs(task: TaskSpec, row: dict[str, Any]) -> list[tuple[str, str]]:
    if task.type == "multiple_choice":
        return [(row["context"], c) for c in row["choices"]]
    if task.type == "generation":
        return [(row["prompt"], row["answer"])]
    return []


def _trailing_space(col: _Collector, i: int, prompt: str, answer: str, tok) -> bool:
    """E111 for a generation prompt ending in whitespace; True when it is reported.

    The test: are the prompt's tokens exactly the tokens running text (prompt + answer) has
    before the answer? Then the model saw this very prefix in training and the space is right.
    Otherwise the space belongs to the answer's first token in running text.
    """
    tail = prompt[-20:]
    if tok is None:
        col.add(
            "E111",
            i,
            f"prompt ends in whitespace: {tail!r}; without the tokenizer the lint cannot tell "
            "whether the model saw the space as its own token (then the prompt needs it) or "
            "inside the answer's first token (a trap): pass --tokenizer",
            severity="warning",
        )
        return True
    if not answer:
        return False  # nothing to continue with: E115 reports the empty answer
    p = tok.encode(prompt, add_special_tokens=False).ids
    joint = tok.encode(prompt + answer, add_special_tokens=False)
    if len(joint.ids) > len(p) and joint.ids[: len(p)] == p:
        return False  # the space is its own token in running text: the prompt needs it
    # Where running text departs from the prompt's tokens: the token that swallowed the space.
    common = min(len(p), len(joint.ids))
    k = next((j for j in range(common) if p[j] != joint.ids[j]), common - 1)
    seen = tok.decode([joint.ids[k]])
    col.add(
        "E111",
        i,
        f"prompt ends in whitespace: {tail!r}; in running text the model saw {seen!r} (the "
        "space inside the answer's first token), so after this prompt it would have to "
        f"produce {seen.lstrip()!r} without its space: end the prompt before the space",
        seen_in_training=seen,
    )
    return True


def _lint_row(col: _Collector, task: TaskSpec, i: int, row: dict[str, Any], tok, bos) -> None:
    trapped = False
    if task.type == "multiple_choice":
        choices = row["choices"]
        if any(not c for c in choices):
            col.add("E115", i, "a choice is empty (it would always win)")
        dupes = sorted({c for c in choices if choices.count(c) > 1})
        if dupes:
            col.add("E116", i, f"duplicate choices {dupes!r}")
        problem = gold_error(task, row)
        if problem:
            col.add("E117", i, problem, gold=row["gold"])
    elif task.type == "generation":
        if not row["answer"].strip():
            col.add("E115", i, "the answer is empty")
        problem = answer_error(task, row)
        if problem:
            col.add("E118", i, problem)
        if row["prompt"][-1:] in (" ", "\t"):
            trapped = _trailing_space(col, i, row["prompt"], row["answer"], tok)
    elif not row["text"]:
        col.add("E115", i, "the text is empty")
    for context, cont in [] if trapped else _pairs(task, row):
        if context[-1:].isspace() and cont[:1].isspace():
            col.add(
                "E111",
                i,
                f"context ends and continuation starts with whitespace: "
                f"{context[-20:]!r} + {cont[:20]!r}",
            )
        elif tok is not None and context and cont:
            joint = tok.encode(context + cont, add_special_tokens=False).ids
            split = tok.encode(context, add_special_tokens=False).ids + encode_continuation(
                tok, cont
            )
            if joint != split:
                col.add(
                    "E112",
                    i,
                    f"{context[-20:]!r} | {cont[:20]!r} tokenises differently split and joined",
                )
    text = row.get("context", row.get("prompt", row.get("text", "")))
    if bos and text.startswith(bos):
        col.add("E114", i, f"the text itself starts with {bos!r}, which the spec also adds")
    elif tok is not None:
        start = tok.token_to_id(bos or DOC_START)
        if start is None:
            if bos:  # the spec names a start token this tokenizer does not have
                col.add("E113", i, f"the tokenizer has no token {bos!r}, so none is added")
            return
        ids = encode_context(tok, bos, text)
        lead = next((k for k, t in enumerate(ids) if t != start), len(ids))
        if lead == 0:
            col.add("E113", i, f"sequence does not start with {bos or DOC_START!r}")
        elif lead > 1:
            col.add("E114", i, f"sequence starts with {bos or DOC_START!r} {lead} times")


def lint_spec(
    spec: str | EvalSpec,
    tokenizer: Tokenizer | None = None,
    *,
    data: Any | None = None,
    max_examples: int | None = None,
) -> list[Finding]:
    """Findings for every task of a spec; token-level checks need the tokenizer."""
    spec = load_spec(spec)
    where = spec.path or spec.name
    findings: list[Finding] = []
    for task in spec.tasks:
        col = _Collector(task)
        for i, row in enumerate(task_rows(spec, task, data, max_examples)):
            _lint_row(col, task, i, row, tokenizer, spec.bos)
        findings += col.findings(where)
    return findings


def lint_specs(
    specs: Sequence[str | EvalSpec],
    tokenizer: Tokenizer | None = None,
    *,
    data: Any | None = None,
    max_examples: int | None = None,
) -> list[Finding]:
    """Pre-flight entry point: the lint of every spec of a recipe's `evals.specs`."""
    out: list[Finding] = []
    for s in specs:
        out += lint_spec(s, tokenizer, data=data, max_examples=max_examples)
    return out
