"""The chat checks as a Trainer's pre-flight: on its own dataset and, with its collator, on the
batches it will train on (labels and packing as the collator makes them).

    from trainguard.checks.chat_data import check_chat_dataset
    findings = check_chat_dataset(trainer.train_dataset, trainer.processing_class,
                                  collator=trainer.data_collator, max_length=2048)

`GuardedTrainer(..., check_chat=True)` runs it before training starts.
"""

from __future__ import annotations

from itertools import accumulate, islice
from typing import Any

from trainguard.checks.chat_data.check import check_chat_rows
from trainguard.checks.chat_data.rows import ChatRow, parse_row
from trainguard.errors import ConfigError
from trainguard.findings import Finding

FEATURES = ("input_ids", "attention_mask", "labels", "position_ids", "token_type_ids")
FEATURES_TRL = ("completion_mask", "assistant_masks", "seq_lengths")  # TRL's collator reads
GROUP = 4  # examples per collated batch: enough to see padding and packing


def _list(value: Any) -> list[Any] | None:
    if value is None:
        return None
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _unpadded(ids: list[int], feature: dict[str, Any]) -> range:
    """The positions of `ids` (a collated row without attention mask) that hold the feature's
    own tokens: padding on the right or on the left, as the collator put it."""
    own = _list(feature["input_ids"]) or []
    n = len(own)
    if n < len(ids) and ids[-n:] == own and ids[:n] != own:
        return range(len(ids) - n, len(ids))
    return range(min(n, len(ids))) if ids[:n] == own else range(len(ids))


def _collated(
    rows: list[ChatRow], items: list[Any], collator: Any
) -> tuple[list[ChatRow], list[Finding]]:
    """`rows` with their token columns as `collator` makes them (padding removed), plus one
    packed row per batch the collator packed into a single sequence."""
    keep = (*FEATURES, *FEATURES_TRL)
    features = [{k: v for k, v in dict(item).items() if k in keep} for item in items]
    if not all("input_ids" in f for f in features):
        why = "the dataset holds no input_ids yet (the trainer tokenizes it later)"
        return rows, [
            Finding.of("D402", f"collator not checked: {why}", data={"skipped": "collator"})
        ]
    out: list[ChatRow] = []
    for g in range(0, len(rows), GROUP):
        group, feats = rows[g : g + GROUP], features[g : g + GROUP]
        try:
            batch = collator(feats)
        except Exception as e:  # a user's collator: any failure is reported, not raised
            msg = f"collator not checked from example {g} on: it raised {type(e).__name__}: {e}"
            return out + rows[g:], [Finding.of("D402", msg, data={"skipped": "collator"})]
        ids = [_list(r) for r in batch["input_ids"]]
        cols = {
            k: [_list(r) for r in batch[k]] for k in FEATURES if k in batch and k != "input_ids"
        }
        if len(ids) == 1 and len(group) > 1:  # packed: one sequence for the group
            lengths = [len(_list(f["input_ids"]) or []) for f in feats]
            starts = list(accumulate(lengths))[:-1]
            out.append(ChatRow(index=group[0].index, input_ids=ids[0], packed=True,
                               position_ids=cols.get("position_ids", [None])[0],
                               attention_mask=cols.get("attention_mask", [None])[0],
                               known_starts=starts, extra=True))  # fmt: skip
            labels = cols.get("labels", [None])[0]
            for row, a, n in zip(group, [0, *starts], lengths, strict=True):
                row.input_ids = ids[0][a : a + n]
                row.labels = labels[a : a + n] if labels is not None else None
                row.position_ids = row.attention_mask = None
                out.append(row)
            continue
        for k, row in enumerate(group):
            mask = cols.get("attention_mask", [None] * len(ids))[k]
            keep_t = [t for t, m in enumerate(mask) if m] if mask else _unpadded(ids[k], feats[k])
            row.input_ids = [ids[k][t] for t in keep_t]
            for name in ("labels", "position_ids"):
                col = cols.get(name)
                setattr(row, name, [col[k][t] for t in keep_t] if col else None)
            row.attention_mask, row.text = None, None
            out.append(row)
    return out, []


def check_chat_dataset(
    dataset: Any, tokenizer: Any, collator: Any = None, max_length: int | None = None,
    max_examples: int = 256, template: str | None = None,
) -> list[Finding]:  # fmt: skip
    """The chat checks on the first `max_examples` items of `dataset` (dicts with `messages`,
    `prompt`/`completion`, `text` or `input_ids` ...), with a Hugging Face `tokenizer`; with
    `collator`, labels and packing are checked on the batches it makes from them."""
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            "the chat checks need a fast tokenizer (character offsets locate each turn)",
            "load the tokenizer from its tokenizer.json (AutoTokenizer with use_fast=True)",
        )
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        items = [dataset[i] for i in range(min(len(dataset), max_examples))]
    else:  # an iterable dataset: its first items
        items = list(islice(iter(dataset), max_examples))
    rows = [parse_row(dict(item), i, f"train_dataset[{i}]") for i, item in enumerate(items)]
    extra: list[Finding] = []
    if collator is not None:
        rows, extra = _collated(rows, items, collator)
    return check_chat_rows(rows, tokenizer, template, max_length).findings + extra
