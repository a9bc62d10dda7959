"""`trainguard batch RUN_DIR --step N`: the global batch behind a step, decoded.

The batch of step N (0-based, as logged) is found by the global position its metrics row logs
(`position`), or, for a step the guard rolled back, by the position the rollback event lists
for it (`bad_positions`), so it is found after rollbacks too. A run logged before positions
were logged falls back to `ElasticSampler` (its step N) with the skips the rollback events
recorded. Each sample is shown with the documents and token offsets it comes from, its decoded
text, the flags the data filters raise on those documents (D140), and its loss recomputed from
the newest checkpoint of at most N completed steps (the weights step N saw) when one exists.
Nothing is written to the run dir.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.checkpoint.local import scan_root
from trainguard.checkpoint.manifest import step_dirname
from trainguard.checkpoint.target import run_checkpoint_root
from trainguard.config.schema import Recipe
from trainguard.data.order import batch_hash
from trainguard.data.prepare import PreparedData, cache_key, default_cache_dir, open_prepared
from trainguard.data.sampler import ElasticSampler
from trainguard.errors import BadInputError, DataError
from trainguard.filters.registry import apply_rules, reasons
from trainguard.findings import Finding
from trainguard.metrics.jsonl import METRICS_FILE, read_metrics

# The guard's objections a batch may explain: the report links these findings to the batch.
BATCH_CODES = ("R101", "R102", "R103", "R206")


def batch_command(run_dir: str | Path, step: int) -> str:
    """The command line that decodes the batch of `step` (what the report shows)."""
    return f"trainguard batch {run_dir} --step {step}"


@dataclass
class BatchView:
    """The decoded batch of one step; `to_dict()` is `batch --json` (with ok and findings)."""

    step: int
    position: int
    attempts: list[dict[str, Any]]
    loss_from_step: int | None
    samples: list[dict[str, Any]]
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "position": self.position,
            "attempts": self.attempts,
            "loss_from_step": self.loss_from_step,
            "samples": self.samples,
        }


def _open_run(
    run_dir: Path, skipped: list[str] | None = None
) -> tuple[list[dict[str, Any]], Recipe]:
    from trainguard.config.load import RECIPE_FILE, read_run_recipe, validate_recipe

    if not run_dir.is_dir():
        raise BadInputError(
            f"run dir {run_dir} does not exist" if not run_dir.exists() else f"{run_dir} is a file",
            "pass the folder that `trainguard run` wrote (default runs/<recipe name>)",
        )
    if not (run_dir / METRICS_FILE).exists():
        raise BadInputError(
            f"{run_dir} has no {METRICS_FILE}: it is not a trainguard run dir",
            "pass the folder that `trainguard run` wrote (default runs/<recipe name>)",
        )
    raw = read_run_recipe(run_dir)
    if not raw:
        raise BadInputError(
            f"{run_dir} has no {RECIPE_FILE}: the batch cannot be decoded without the recipe",
            f"restore {run_dir / RECIPE_FILE} (trainguard wrote it when the run started)",
        )
    rows = read_metrics(run_dir, skipped)
    return rows, validate_recipe(raw, str(run_dir / RECIPE_FILE))


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def find_attempts(rows: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """Every batch the run read as step `step`, in log order: step rows (`outcome` the row's
    action) and the bad steps of rollback events (`outcome` "rollback")."""
    found = []
    for r in rows:
        if r.get("kind") == "step" and r.get("step") == step:
            found.append(
                {
                    "position": _int(r.get("position")),
                    "outcome": r.get("action") or "apply",
                    "batch_hash": r.get("batch_hash"),
                    "loss": r.get("loss"),
                }
            )
        elif r.get("kind") == "event" and r.get("event") == "rollback":
            pos = _int((r.get("bad_positions") or {}).get(str(step)))
            if pos is not None:
                found.append({"position": pos, "outcome": "rollback", "batch_hash": None})
    return found


def _inferred_position(rows: list[dict[str, Any]], recipe: Recipe, n: int, step: int) -> int:
    """A log without positions: the sampler's step N with the skips the rollbacks logged."""
    t = recipe.train
    sampler = ElasticSampler(
        n,
        global_batch_size=t.batch_ramp or t.batch_size * t.grad_accum,
        seed=t.seed,
        rank=0,
        world_size=1,
    )
    skips = [
        rng
        for r in rows
        if r.get("kind") == "event" and r.get("event") == "rollback"
        for rng in r.get("skipped_positions") or []
    ]
    sampler.load_state_dict(sampler.state_dict() | {"skipped_positions": skips})
    return sampler.position(step)


def _prepared(run_dir: Path, recipe: Recipe) -> PreparedData:
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


def _sample_loss_model(run_dir: Path, before: int) -> tuple[Any, int | None]:
    """The model of the newest local checkpoint at or before step `before` that verifies."""
    from trainguard.evals.load import open_for_eval

    root = run_checkpoint_root(run_dir)
    if "://" in root and not root.startswith("file://"):
        return None, None  # an object store: per-sample losses need a local copy
    root_path = Path(root.removeprefix("file://"))
    steps, _ = scan_root(root_path)
    for s in sorted((s for s in steps if s <= before), reverse=True):
        opened = open_for_eval(root_path / step_dirname(s))
        if opened.model is not None:
            return opened.model, s
    return None, None


def _losses(model: Any, tokens: np.ndarray, chunk: int) -> list[float]:
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


def decode_batch(run_dir: str | Path, step: int, skipped: list[str] | None = None) -> BatchView:
    """The decoded global batch of step `step`; BadInputError (exit 2) for what cannot be.
    `skipped`, when given, receives the metrics.jsonl lines left out ("path:line: why")."""
    run_dir = Path(run_dir)
    rows, recipe = _open_run(run_dir, skipped)
    logged = sorted(
        {s for r in rows if r.get("kind") == "step" and (s := _int(r.get("step"))) is not None}
    )
    attempts = find_attempts(rows, step)
    if not attempts:
        have = f"steps {logged[0]}..{logged[-1]}" if logged else "no steps"
        raise BadInputError(
            f"step {step} is out of range: {run_dir} logged {have}",
            f"pass --step between {logged[0]} and {logged[-1]}"
            if logged
            else "train the run first (trainguard run RECIPE --run-dir RUN_DIR)",
        )
    data = _prepared(run_dir, recipe)
    seq_len, n = recipe.data.seq_len, data.train.num_samples(recipe.data.seq_len)
    # The batch the guard objected to, if any (what a finding at this step is about); else the
    # batch the step finally trained on.
    chosen = next((a for a in attempts if a["outcome"] != "apply"), attempts[-1])
    findings: list[Finding] = []
    position = chosen["position"]
    if position is None:
        position = _inferred_position(rows, recipe, n, step)
        chosen["position"] = position
    t = recipe.train
    sampler = ElasticSampler(
        n,
        global_batch_size=t.batch_ramp or t.batch_size * t.grad_accum,
        seed=t.seed,
        rank=0,
        world_size=1,
    )
    # The step's size: a ramp (train.batch_ramp) reads fewer sequences in its early steps.
    ids = sampler.order.sample_ids(position, sampler.global_batch_size_at(step))
    if chosen.get("batch_hash") and chosen["batch_hash"] != batch_hash(ids):
        findings.append(
            Finding.of(
                "D141",
                f"the batch decoded for step {step} (hash {batch_hash(ids)}) is not the one "
                f"the run logged (hash {chosen['batch_hash']})",
                step=step,
            )
        )
    tokens = data.train.samples(ids, seq_len)
    model, loss_step = _sample_loss_model(run_dir, step)  # the weights step `step` saw
    losses = _losses(model, tokens, recipe.train.batch_size) if model is not None else None
    doc_flags: dict[int, list[dict[str, str]]] = {}
    samples = []
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
        text = data.tokenizer.decode(tokens[i].tolist(), skip_special_tokens=False)
        samples.append(
            {
                "index": i,
                "sample_id": sample_id,
                "documents": docs,
                "text": text,
                "flags": [f | {"doc": d["doc"]} for d in docs for f in d["flags"]],
                "loss": losses[i] if losses is not None else None,
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
    return BatchView(step, position, attempts, loss_step, samples, findings)
