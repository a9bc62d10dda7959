"""The examples `data check-chat` reads: one JSON object per line (or a dataset's item), each a
conversation, a prompt/response pair, or pre-rendered token columns.

Accepted fields (docs/data.md, "Chat data"):
- `messages`: a list of `{"role", "content"}` (content a string, or null: an empty turn);
- `prompt` with `response` or `completion` (strings, or TRL's lists of messages), and an
  optional `system`: read as [system,] user, assistant;
- the training side's own rendering, when the pipeline stored it: `text` (a string the trainer
  tokenizes) or `input_ids` (token ids), with `labels` (-100 = no loss), `attention_mask`
  (0/1, or segment ids 1, 2, 3 ... for packed rows, or a 2-D mask), `position_ids`,
  `seq_lengths` (or `seq_lens`: the lengths of the documents a packed row holds),
  `cu_seqlens`, and `packed` (true for a row that packs several examples).

A row with none of `messages`, `prompt`, `text`, `input_ids` is bad input naming its line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import DataError
from trainguard.util.inputs import require_file

ROW_FIX = (
    'give one JSON object per line: {"messages": [{"role": "user", "content": ...}, '
    '{"role": "assistant", "content": ...}]} or {"prompt": ..., "response": ...}'
)
TOKEN_COLUMNS = ("input_ids", "labels", "attention_mask", "position_ids", "seq_lengths")


@dataclass
class ChatRow:
    """One example; `index` is its id: the 0-based line number in the file (dataset index)."""

    index: int
    messages: list[dict[str, str]] | None = None
    text: str | None = None
    input_ids: list[int] | None = None
    labels: list[int] | None = None
    attention_mask: list[Any] | None = None
    position_ids: list[int] | None = None
    seq_lengths: list[int] | None = None
    cu_seqlens: list[int] | None = None
    packed: bool = False
    # Document starts known from outside the row (a collator's packing of known examples):
    # evidence for the packing check, not a mask the trainer applies.
    known_starts: list[int] = field(default_factory=list)
    # A view of examples counted elsewhere (a collator's packed batch of them).
    extra: bool = False


def _ints(value: Any, name: str, where: str) -> list[Any] | None:
    if value is None:
        return None
    if hasattr(value, "tolist"):  # a tensor or numpy array from a dataset
        value = value.tolist()
    if not isinstance(value, list):
        raise DataError(f"{where}: {name} is {type(value).__name__}, not a list", ROW_FIX)
    if value and isinstance(value[0], list) and name != "attention_mask":
        if len(value) != 1:
            raise DataError(f"{where}: {name} holds {len(value)} sequences, not one", ROW_FIX)
        value = value[0]  # a batch of one, as some pipelines store it
    return value


def _content(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        # OpenAI-style parts: the text parts, in order (images are not checked here).
        return "".join(str(p.get("text", "")) for p in value if p.get("type", "text") == "text")
    raise DataError(f"{where}: a message content is {type(value).__name__}, not text", ROW_FIX)


def _messages(value: Any, where: str) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise DataError(f"{where}: messages is {type(value).__name__}, not a list", ROW_FIX)
    out = []
    for m in value:
        if not isinstance(m, Mapping) or "role" not in m:
            raise DataError(f"{where}: a message is not an object with a role", ROW_FIX)
        # Other keys (tool_calls, name ...) stay: templates render them.
        out.append({**m, "role": str(m["role"]), "content": _content(m.get("content"), where)})
    return out


def parse_row(raw: Mapping[str, Any], index: int, where: str) -> ChatRow:
    """The example in `raw` (a JSON object or a dataset item); DataError naming `where`."""
    row = ChatRow(index=index)
    if raw.get("messages") is not None:
        row.messages = _messages(raw["messages"], where)
    elif raw.get("prompt") is not None:
        answer = raw.get("response", raw.get("completion"))
        if answer is None:
            raise DataError(f"{where}: a prompt without a response or completion", ROW_FIX)
        system = []
        if raw.get("system") is not None:
            system = [{"role": "system", "content": _content(raw["system"], where)}]
        prompt = _messages(raw["prompt"], where)
        reply = _messages(answer, where)
        if isinstance(answer, str):
            reply = [{"role": "assistant", "content": answer}]
        row.messages = system + prompt + reply
    text = raw.get("text")
    if text is not None and not isinstance(text, str):
        raise DataError(f"{where}: text is {type(text).__name__}, not a string", ROW_FIX)
    row.text = text
    row.input_ids = _ints(raw.get("input_ids"), "input_ids", where)
    row.labels = _ints(raw.get("labels"), "labels", where)
    row.attention_mask = _ints(raw.get("attention_mask"), "attention_mask", where)
    row.position_ids = _ints(raw.get("position_ids"), "position_ids", where)
    row.seq_lengths = _ints(raw.get("seq_lengths", raw.get("seq_lens")), "seq_lengths", where)
    row.cu_seqlens = _ints(raw.get("cu_seqlens"), "cu_seqlens", where)
    row.packed = bool(raw.get("packed", False))
    if row.messages is None and row.text is None and row.input_ids is None:
        raise DataError(f"{where}: none of messages, prompt/response, text or input_ids", ROW_FIX)
    if row.labels is not None and row.input_ids is None:
        raise DataError(
            f"{where}: labels without input_ids (labels are positions in input_ids)",
            "store input_ids beside labels, or drop labels",
        )
    for name in ("labels", "position_ids"):
        values = getattr(row, name)
        if values is not None and row.input_ids is not None and len(values) != len(row.input_ids):
            raise DataError(
                f"{where}: {name} has {len(values)} entries, input_ids {len(row.input_ids)}",
                f"give {name} one entry per token of input_ids",
            )
    return row


def read_rows(path: str | Path, max_examples: int | None = None) -> Iterator[ChatRow]:
    """The examples of a JSON Lines file, ids = 0-based line numbers (blank lines skipped)."""
    fix = "give a JSON Lines file of chat examples (one JSON object per line)"
    path = require_file(path, "chat data", fix, DataError)
    seen = 0
    try:
        handle = path.open("rb")
    except OSError as e:
        raise DataError(f"cannot read chat data {path}: {e.strerror or e}", fix) from None
    with handle:
        for lineno, raw in enumerate(handle):
            if max_examples is not None and seen >= max_examples:
                return
            where = f"{path}:{lineno + 1}"
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                raise DataError(
                    f"chat data {where} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at "
                    f"column {e.start + 1})",
                    "save the file as UTF-8",
                ) from None
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise DataError(f"{where} is not JSON ({e.msg})", fix) from None
            if not isinstance(obj, dict):
                raise DataError(f"{where} is a JSON {type(obj).__name__}, not an object", ROW_FIX)
            seen += 1
            yield parse_row(obj, lineno, where)
    if seen == 0:
        raise DataError(f"chat data {path} holds no example", fix)
