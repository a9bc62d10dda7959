"""`data check-chat`: instruction-tuning data against the tokenizer's chat template.

For each example: its structure (roles, empty turns, system prompt), its training rendering
token by token against the tokenizer's chat template (what serving applies), its loss mask,
its truncation at the training length, and packing. One finding per fault with the example
ids (docs/data.md, "Chat data"; codes D401-D414).

The training rendering of an example is, in this order: its `input_ids` column; its `text`
column tokenized as a trainer tokenizes text (`tokenizer(text)`, special tokens added); the
`--template` file applied to its messages. Without any of these the training side is the
tokenizer's own template: nothing to compare (D402, info).
Labels are the `labels` column, else the assistant tokens the training template marks with
`{% generation %}` (transformers' `return_assistant_tokens_mask`); without either the loss
mask is not checked, and truncation counts the assistant turns and their end-of-turn tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainguard.checks.chat_data.collect import Hits
from trainguard.checks.chat_data.labels import (
    loss_mask_hits,
    response_end_hits,
    response_positions,
    truncation_hits,
)
from trainguard.checks.chat_data.packing import packing_hits
from trainguard.checks.chat_data.render import (
    Rendered,
    encode,
    first_difference,
    generation_mask,
    message_spans,
    render,
    token_text,
)
from trainguard.checks.chat_data.rows import ChatRow
from trainguard.checks.chat_data.structure import doubled_special_hits, structure_hits
from trainguard.checks.chat_data.tokenizer import has_generation_tags, template_source
from trainguard.findings import Finding


@dataclass
class ChatReport:
    findings: list[Finding]
    stats: dict[str, Any] = field(default_factory=dict)


def _special_ids(tok: Any) -> set[int]:
    """Ids that can end a turn: the special tokens (added tokens marked special included)."""
    ids = set(tok.all_special_ids)
    ids |= {i for i, t in tok.added_tokens_decoder.items() if getattr(t, "special", False)}
    if tok.bos_token_id is not None and tok.bos_token_id != tok.eos_token_id:
        ids.discard(tok.bos_token_id)
    return ids


def _is_template_error(e: Exception) -> bool:
    from jinja2 import TemplateError

    return isinstance(e, TemplateError)


class _Checker:
    def __init__(self, tok: Any, template: str | None, max_length: int | None) -> None:
        self.tok = tok
        self.serving_template = template_source(tok)
        self.training_template = template
        self.max_length = max_length
        self.special = _special_ids(tok)
        self.hits = Hits()
        self.stats = {
            "examples": 0,
            "compared": 0,
            "not_compared": 0,
            "no_messages": 0,
            "labeled": 0,
            "packed": 0,
        }

    def _render(self, row: ChatRow, template: str, source: str) -> Rendered | None:
        assert row.messages is not None
        try:
            out = encode(self.tok, render(self.tok, row.messages, template), source)
        except Exception as e:  # a template is the user's code: raise_exception, a TypeError ...
            said = f"{type(e).__name__}: {e}" if not _is_template_error(e) else str(e)
            self.hits.add("D414", row.index, f"the {source} raises: {said}", template=source)
            return None
        if row.labels is None and has_generation_tags(template):
            try:
                mask = generation_mask(self.tok, row.messages, template)
            except Exception:  # rendered once above: a mask that fails is no mask
                mask = None
            out.mask = mask if mask is not None and len(mask) == len(out.ids) else None
        return out

    def _training(self, row: ChatRow, serving: Rendered | None) -> Rendered | None:
        if row.input_ids is not None:
            return Rendered(list(row.input_ids), source="input_ids column")
        if row.text is not None:
            # As a trainer tokenizes a text column: with the tokenizer's special tokens.
            return encode(self.tok, row.text, "text column", add_special_tokens=True)
        if row.messages is not None and self.training_template is not None:
            return self._render(row, self.training_template, "--template")
        return serving

    def check(self, row: ChatRow) -> None:
        self.stats["examples"] += not row.extra
        i, msgs = row.index, row.messages
        serving = None
        if msgs is not None:
            structure_hits(i, msgs, self.hits)
            if self.serving_template is not None:
                serving = self._render(row, self.serving_template, "tokenizer's chat template")
        train = self._training(row, serving)
        full, precut = train, False
        if train is not None and serving is not None and train is not serving:
            self.stats["compared"] += 1
            d = first_difference(train.ids, serving.ids)
            if d is not None and train.text is None and d == len(train.ids) < len(serving.ids):
                full, precut = serving, True  # input_ids cut short before training: truncation
            elif d is not None:
                self.hits.add(
                    "D401",
                    i,
                    f"token {d}: training ({train.source}) has {token_text(self.tok, train.ids, d)}"
                    f", the chat template {token_text(self.tok, serving.ids, d)}",
                    position=d,
                    training=token_text(self.tok, train.ids, d),
                    template=token_text(self.tok, serving.ids, d),
                    training_source=train.source,
                )
        elif msgs is not None and train is serving:
            self.stats["not_compared"] += 1
        elif msgs is None and not row.extra:
            self.stats["no_messages"] += 1
        if train is None:
            self._packing(row)
            return
        spans = []
        if msgs is not None:
            # Spans need characters: pre-tokenized ids borrow those of a rendering they equal.
            source = full if full.text is not None else serving
            if source is not None and (source is full or source.ids == train.ids):
                spans = message_spans(source, msgs, self.special)
        tok = self.tok
        decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
        doubled_special_hits(i, train.ids, tok.bos_token_id, tok.eos_token_id, decode, self.hits)
        labels = row.labels
        if labels is None and train.mask is not None:
            labels = [t if m else -100 for t, m in zip(train.ids, train.mask, strict=True)]
        cut = False
        if self.max_length is not None or precut:
            response = response_positions(labels if not precut else None, spans)
            cutoff = min(len(train.ids), self.max_length or len(train.ids))
            why = "--max-length" if cutoff == self.max_length else "input_ids end at"
            cut = truncation_hits(i, response, len(full.ids), cutoff, why, self.hits)
        if labels is not None:
            self.stats["labeled"] += 1
            show = lambda t: token_text(self.tok, train.ids, t)  # noqa: E731
            loss_mask_hits(i, labels, spans, show, self.hits, truncated=precut or cut)
        else:
            response_end_hits(i, spans, self.hits, truncated=precut or cut)
        self._packing(row)

    def _packing(self, row: ChatRow) -> None:
        if row.input_ids is not None and packing_hits(
            row.index, row, self.tok.bos_token_id, self.hits
        ):
            self.stats["packed"] += 1

    def findings(self) -> list[Finding]:
        total = self.stats["examples"]
        out = self.hits.findings(total)
        skipped = []
        if self.serving_template is None:
            skipped.append(
                "the tokenizer has no chat_template: the training rendering was not compared "
                "with what serving applies"
            )
        elif self.stats["not_compared"]:
            skipped.append(
                f"{self.stats['not_compared']} of {total} examples carry no training rendering "
                "(no text or input_ids column) and no --template was given: their rendering is "
                "the chat template's own, not compared"
            )
        if self.stats["no_messages"]:
            skipped.append(
                f"{self.stats['no_messages']} of {total} examples carry no messages (only text "
                "or token columns): their rendering, roles and loss mask by turn were not checked"
            )
        out += [Finding.of("D402", s, data={"skipped": "rendering"}) for s in skipped]
        return out


def check_chat_rows(
    rows: Iterable[ChatRow], tokenizer: Any, template: str | None = None,
    max_length: int | None = None,
) -> ChatReport:  # fmt: skip
    """Every check on `rows` with a loaded Hugging Face tokenizer; `template`: the training
    side's Jinja chat template (None: the rows' own columns, else the tokenizer's)."""
    checker = _Checker(tokenizer, template, max_length)
    for row in rows:
        checker.check(row)
    stats = {**checker.stats, "max_length": max_length}
    for code, key in (("D405", "cut"), ("D406", "no_response"), ("D401", "differ")):
        stats[key] = checker.hits.count(code)
    return ChatReport(checker.findings(), stats)


def check_chat_file(
    path: str, tokenizer_dir: str, template_file: str | None = None,
    max_length: int | None = None, max_examples: int | None = None,
) -> ChatReport:  # fmt: skip
    """`data check-chat`: the JSONL file `path` with the tokenizer folder `tokenizer_dir`.
    Bad input (a missing file, a line that is not JSON, a tokenizer folder without
    tokenizer.json, or without a chat_template when no `template_file` is given) raises
    BadInputError before any example is checked."""
    from trainguard.checks.chat_data.rows import read_rows
    from trainguard.checks.chat_data.tokenizer import (
        TOKENIZER_FIX,
        check_template,
        load_chat_tokenizer,
        read_template,
    )
    from trainguard.errors import BadInputError
    from trainguard.util.inputs import require_file

    require_file(path, "chat data", "give a JSON Lines file of chat examples")
    template = read_template(template_file) if template_file is not None else None
    tok = load_chat_tokenizer(tokenizer_dir)
    serving = template_source(tok)
    if serving is None and template is None:
        raise BadInputError(
            f"the tokenizer in {tokenizer_dir} has no chat_template to check the data against",
            f"give --template FILE (the training side's template), or {TOKENIZER_FIX}",
        )
    if serving is not None:
        check_template(serving, f"the chat_template of {tokenizer_dir}", TOKENIZER_FIX)
    # Every line is parsed once before any check runs (bad input is exit 2 with nothing
    # reported), then read again as the checks go: a large file is never held in memory.
    for _ in read_rows(path, max_examples):
        pass
    return check_chat_rows(read_rows(path, max_examples), tok, template, max_length)
