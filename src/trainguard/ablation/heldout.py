"""The held-out set every run of an ablation is scored on, and the training data without it.

Each run's own validation split comes from its own data (a hash of document ids over a
different set of documents), so its validation losses do not compare across variants. The
held-out set is carved once from BASE instead: the documents whose text hashes lowest (a
stable hash, so the same BASE always gives the same set), at most `max_docs`. Every training
set, the base's and each variant's, is written without them (matched by text, so a variant
that renumbers or reorders its documents loses them all the same): no run trains on what it
is scored on. The set is scored as bits per byte (a `perplexity` eval task), which does not
depend on the tokenizer each run trains on its own data.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from trainguard.data.corpus import iter_documents
from trainguard.errors import BadInputError
from trainguard.util.atomic import atomic_paths, atomic_write_text
from trainguard.util.hashing import stable_u64

HELDOUT_TASK = "ablation_heldout"
HELDOUT_METRIC = f"{HELDOUT_TASK}/bpb"
KEPT_PREFIX = "ablation_kept_"
"""`ablation_kept_NAME`: the held-out documents variant NAME's filter kept. Scored by every
run, compared for NAME only: the base's held-out set also measures the text a filter removes
on purpose, on which the variant is worse by design."""


def _key(text: str) -> int:
    return stable_u64("ablation-heldout:" + text)


def carve_heldout(
    base: str, text_field: str, fraction: float, max_docs: int, out_dir: Path
) -> tuple[dict[str, int], dict[int, str]]:
    """Write OUT/ablation_heldout.jsonl and its eval spec; returns the counts and the held-out
    texts by hash (for `write_training`). Two passes over BASE: only the hashes stay in memory
    while the set is chosen."""
    keys = sorted(_key(doc.text) for doc in iter_documents(base, text_field))
    total = len(keys)
    want = min(max_docs, max(1, int(total * fraction)))
    if total - want < 1:
        raise BadInputError(
            f"BASE {base} holds {total} document(s): too few to hold some out and train on "
            "the rest",
            "give BASE more documents (a few hundred at least for a meaningful ablation)",
        )
    chosen = set(keys[:want])
    texts: dict[int, str] = {}
    for doc in iter_documents(base, text_field):
        key = _key(doc.text)
        if key in chosen:
            texts.setdefault(key, doc.text)
    write_heldout(out_dir, HELDOUT_TASK, [texts[k] for k in sorted(texts)])
    return {"docs": len(texts), "base_docs": total}, texts


def write_heldout(out_dir: Path, task: str, texts: list[str]) -> Path:
    """OUT/TASK.jsonl and the eval spec OUT/TASK.yaml scoring it (bits per byte)."""
    atomic_write_text(
        out_dir / f"{task}.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts)
    )
    spec = {
        "name": task,
        "description": "Held-out documents of BASE, the same for every run of the ablation.",
        "use_case": False,
        "tasks": [{"name": task, "type": "perplexity", "data": f"{task}.jsonl"}],
    }
    path = out_dir / f"{task}.yaml"
    atomic_write_text(path, yaml.safe_dump(spec, sort_keys=False))
    return path


def write_training(
    source: str, text_field: str, heldout: set[int], path: Path
) -> tuple[dict[str, int], set[int]]:
    """`source`'s documents minus the held-out ones as JSON Lines at `path` (atomically);
    returns the counts and the held-out documents `source` holds (what its filter kept)."""
    kept = removed = 0
    present: set[int] = set()
    with atomic_paths(path) as (tmp,), open(tmp, "w", encoding="utf-8") as f:
        for doc in iter_documents(source, text_field):
            key = _key(doc.text)
            if key in heldout:
                removed += 1
                present.add(key)
                continue
            kept += 1
            f.write(json.dumps({"text": doc.text}) + "\n")
        if kept == 0:
            raise BadInputError(
                f"{source} holds no document outside the held-out set ({removed} held out)",
                "give data with more documents than the held-out set takes",
            )
    return {"docs": kept, "heldout_removed": removed}, present
