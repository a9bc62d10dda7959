"""The text, documents, filter flags and per-sample losses of a `trainguard run` batch, from the
run's prepared data and checkpoints (`report/batch.py` decodes the ids; this shows them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trainguard.checkpoint.local import scan_root
from trainguard.checkpoint.manifest import step_dirname
from trainguard.checkpoint.target import run_checkpoint_root
from trainguard.config.schema import Recipe
from trainguard.data.prepare import PreparedData, cache_key, default_cache_dir, open_prepared
from trainguard.errors import DataError
from trainguard.filters.registry import apply_rules, reasons
from trainguard.findings import Finding


def prepared(run_dir: Path, recipe: Recipe) -> PreparedData:
    d, tok = recipe.data, recipe.tokenizer
    if d.prepared:  # a prepared folder named in the recipe (remote: through the node cache)
        return open_prepared(d)
    cache = Path(d.cache_dir).expanduser() if d.cache_dir else default_cache_dir()
    folder = cache / cache_key(d, tok)
    if not folder.is_dir():
        raise DataError(
            f"no prepared data for {run_dir}: {folder} does not exist (data.cache_dir was "
            "cleaned, or data.source changed since the run)",
            f"prepare it again with the run's settings (trainguard data prepare {d.source} "
            f"--out {cache} --vocab-size {tok.vocab_size} --min-frequency {tok.min_frequency} "
            f"--val-fraction {d.val_fraction} --shard-tokens {d.shard_tokens}), or point "
            f"data.cache_dir in {run_dir}/recipe.yaml at the folder that holds it",
        )
    return PreparedData.from_dir(folder)


def sample_loss_model(run_dir: Path, at_most: int) -> tuple[Any, int | None]:
    """The model of the newest local checkpoint of at most `at_most` completed steps that
    verifies: the state step `at_most` (0-based) started from when it is that one."""
    from trainguard.evals.load import open_for_eval

    root = run_checkpoint_root(run_dir)
    if "://" in root and not root.startswith("file://"):
        return None, None  # an object store: per-sample losses need a local copy
    root_path = Path(root.removeprefix("file://"))
    steps, _ = scan_root(root_path)
    for s in sorted((s for s in steps if s <= at_most), reverse=True):
        opened = open_for_eval(root_path / step_dirname(s))
        if opened.model is not None:
            return opened.model, s
    return None, None


def losses(model: Any, tokens: np.ndarray, chunk: int) -> list[float]:
    """Mean next-token cross-entropy of each sample (fp32), in chunks of a micro-batch."""
    import torch  # only when there is a checkpoint: `report` imports this module too
    import torch.nn.functional as F

    out: list[float] = []
    with torch.no_grad():
        for i in range(0, len(tokens), chunk):
            t = torch.from_numpy(tokens[i : i + chunk])
            logits = model(t[:, :-1]).float()
            ce = F.cross_entropy(logits.flatten(0, 1), t[:, 1:].flatten(), reduction="none")
            out += ce.view(len(t), -1).mean(1).tolist()
    return out


def _documents(data: PreparedData, start: int, stop: int) -> list[dict[str, Any]]:
    """The documents tokens [start, stop) of the train stream come from, with offsets."""
    ds = data.train
    offsets = ds.doc_offsets
    first = int(np.searchsorted(offsets, start, side="right")) - 1
    last = int(np.searchsorted(offsets, stop - 1, side="right")) - 1
    docs = []
    for j in range(first, last + 1):
        begin = int(offsets[j])
        end = int(offsets[j + 1]) if j + 1 < len(offsets) else ds.n_tokens
        docs.append(
            {
                "doc": j,
                "source": ds.sample_sources(np.array([begin]), 1)[0],
                "offset": max(start, begin) - begin,  # tokens into the document
                "tokens": min(stop, end) - max(start, begin),
                "doc_tokens": end - begin,
            }
        )
    return docs


def prepared_samples(
    run_dir: Path,
    recipe: Recipe,
    data: PreparedData,
    ids: np.ndarray,
    step: int,
    with_losses: bool = True,
) -> tuple[list[dict[str, Any]], int | None, list[Finding]]:
    """(samples with documents, text, flags and loss; the checkpoint the losses come from;
    D140 findings) for the global batch `ids` of step `step` (0-based). `with_losses=False`:
    no checkpoint is loaded (the report's batch pages)."""
    seq_len = recipe.data.seq_len
    tokens = data.train.samples(ids, seq_len)
    model, loss_step = sample_loss_model(run_dir, step) if with_losses else (None, None)
    per_sample = losses(model, tokens, recipe.train.batch_size) if model is not None else None
    doc_flags: dict[int, list[dict[str, str]]] = {}
    samples, findings = [], []
    for i, sample_id in enumerate(ids.tolist()):
        docs = _documents(data, sample_id * seq_len, sample_id * seq_len + seq_len + 1)
        for d in docs:
            j = d["doc"]
            if j not in doc_flags:
                begin = int(data.train.doc_offsets[j])
                text = data.tokenizer.decode(
                    data.train.tokens(begin, begin + d["doc_tokens"]).tolist(),
                    skip_special_tokens=True,
                )
                doc_flags[j] = reasons(apply_rules(text))
            d["flags"] = doc_flags[j]
        flagged = [f"doc {d['doc']}: {f['code']}" for d in docs for f in d["flags"]]
        samples.append(
            {
                "index": i,
                "sample_id": sample_id,
                "documents": docs,
                "text": data.tokenizer.decode(tokens[i].tolist(), skip_special_tokens=False),
                "flags": [f | {"doc": d["doc"]} for d in docs for f in d["flags"]],
                "loss": per_sample[i] if per_sample is not None else None,
            }
        )
        if flagged:
            findings.append(
                Finding.of(
                    "D140",
                    f"sample {i} (id {sample_id}) of step {step} comes from documents the "
                    f"data filters reject ({', '.join(flagged)})",
                    step=step,
                    data={"sample": i, "sample_id": sample_id},
                )
            )
    return samples, loss_step, findings
