"""Run eval specs on a model: the metrics dict logged with the run, plus findings.

Metrics per task (`<task>/<metric>`):
- multiple_choice: `acc` (highest total log-likelihood), `acc_norm` (log-likelihood per byte of
  the choice, as lm-evaluation-harness's acc_norm), `n`;
- generation: `acc` (share matching the answer by exact / regex / contains), `n`;
- perplexity: `bpb` (bits per UTF-8 byte over all texts), `bpb_se` (standard error of the
  per-text bits per byte, for the drift test), `n`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tokenizers import Tokenizer

from trainguard.evals.scoring import (
    bos_ids,
    encode_context,
    encode_continuation,
    greedy_generate,
    loglikelihoods,
    sum_nll_bits,
)
from trainguard.evals.spec import (
    EvalSpec,
    TaskSpec,
    check_examples,
    load_spec,
    task_rows,
)
from trainguard.findings import Finding


@dataclass
class EvalResults:
    metrics: dict[str, float] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    examples: int = 0


def score_multiple_choice(model, tokenizer, bos, rows, device) -> dict[str, float]:
    requests, owners = [], []
    for r, row in enumerate(rows):
        ctx = encode_context(tokenizer, bos, row["context"])
        for choice in row["choices"]:
            requests.append((ctx, encode_continuation(tokenizer, choice)))
            owners.append(r)
    lls = loglikelihoods(model, requests, device=device)
    correct = correct_norm = 0
    k = 0
    for row in rows:
        n = len(row["choices"])
        ll = [x for x, _ in lls[k : k + n]]
        norm = [x / max(1, len(c.encode("utf-8"))) for x, c in zip(ll, row["choices"], strict=True)]
        k += n
        correct += max(range(n), key=ll.__getitem__) == row["gold"]
        correct_norm += max(range(n), key=norm.__getitem__) == row["gold"]
    n = max(1, len(rows))
    return {"acc": correct / n, "acc_norm": correct_norm / n, "n": float(len(rows))}


def _matches(output: str, answer: str, how: str) -> bool:
    out, ans = output.strip(), answer.strip()
    if how == "exact":
        return out == ans
    if how == "contains":
        return ans in out
    return re.search(answer, output) is not None


def score_generation(model, tokenizer, bos, task: TaskSpec, rows, device) -> dict[str, float]:
    prompts = [encode_context(tokenizer, bos, row["prompt"]) for row in rows]
    outs = greedy_generate(
        model,
        tokenizer,
        prompts,
        max_new_tokens=task.max_new_tokens,
        stop=task.stop,
        stop_ids=bos_ids(tokenizer, bos),
        device=device,
    )
    hits = sum(_matches(o, row["answer"], task.match) for o, row in zip(outs, rows, strict=True))
    return {"acc": hits / max(1, len(rows)), "n": float(len(rows))}


def score_perplexity(model, tokenizer, bos, rows, device) -> dict[str, float]:
    bits_total, bytes_total, per_text = 0.0, 0, []
    for row in rows:
        ids = encode_context(tokenizer, bos, row["text"])
        n_bytes = len(row["text"].encode("utf-8"))
        bits, _ = sum_nll_bits(model, ids, device=device)
        bits_total += bits
        bytes_total += n_bytes
        per_text.append(bits / max(1, n_bytes))
    n = len(per_text)
    mean = sum(per_text) / max(1, n)
    var = sum((x - mean) ** 2 for x in per_text) / max(1, n - 1)
    return {
        "bpb": bits_total / max(1, bytes_total),
        "bpb_se": math.sqrt(var / max(1, n)),
        "n": float(n),
    }


def run_evals(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    specs: Sequence[str | EvalSpec],
    device: str | torch.device = "cpu",
    max_examples: int | None = None,
    *,
    data: Any | None = None,
    canaries: Sequence[Any] = (),
    step: int | None = None,
) -> EvalResults:
    """Every task of every spec, then the canaries. `data` (the recipe's DataConfig) feeds the
    builtin tasks. The model's train/eval mode is restored afterwards."""
    from trainguard.evals.canaries import run_canaries

    t0 = time.perf_counter()
    was_training = model.training
    results = EvalResults()
    loaded = [load_spec(s) for s in specs]
    for spec in loaded:
        check_examples(spec)  # bad input fails before the first forward, not halfway through
    try:
        for spec in loaded:
            for task in spec.tasks:
                rows = task_rows(spec, task, data, max_examples)
                if task.type == "multiple_choice":
                    m = score_multiple_choice(model, tokenizer, spec.bos, rows, device)
                elif task.type == "generation":
                    m = score_generation(model, tokenizer, spec.bos, task, rows, device)
                else:
                    m = score_perplexity(model, tokenizer, spec.bos, rows, device)
                results.metrics.update({f"{task.name}/{k}": v for k, v in m.items()})
                results.examples += len(rows)
        m, f = run_canaries(model, tokenizer, list(canaries), device=device, step=step)
        results.metrics.update(m)
        results.findings += f
    finally:
        model.train(was_training)
    results.seconds = time.perf_counter() - t0
    return results
