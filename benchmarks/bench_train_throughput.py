"""Training throughput of `trainguard run` against a minimal plain-PyTorch loop.

Same model, same data, same batches, same optimizer, measured side by side in one process,
alternating A/B rounds so that machine noise hits both. trainguard's figure is taken from its
own metric log (wall time between the first and last step rows, so data preparation,
evaluation and checkpoints are excluded: they are periodic costs measured elsewhere); the
plain loop is timed over the same steps.

    python benchmarks/bench_train_throughput.py [--steps 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from machine import describe

from trainguard.config import load_recipe
from trainguard.data.order import ElasticOrder
from trainguard.data.prepare import prepare_data
from trainguard.model.gpt import GPT
from trainguard.train.guarded_run import run_recipe
from trainguard.train.optim import build_optimizer
from trainguard.train.schedule import lr_at


def plain_loop(recipe, data, steps: int) -> float:
    """The baseline: what anyone would write by hand. Returns tokens/s after step 1."""
    t = recipe.train
    torch.manual_seed(t.seed)
    model = GPT(recipe.model, data.vocab_size, recipe.data.seq_len)
    opt = build_optimizer(recipe, model)  # the recipe's optimizer: Muon + AdamW by default
    order = ElasticOrder(data.train.num_samples(recipe.data.seq_len), t.seed)
    G = t.batch_size * t.grad_accum
    start = None
    for step in range(steps):
        factor = lr_at(step, 1.0, t.warmup_steps, t.max_steps, t.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = g["peak_lr"] * factor
        tokens = torch.from_numpy(
            data.train.samples(order.sample_ids(step * G, G), recipe.data.seq_len)
        )
        x, y = tokens[:, :-1], tokens[:, 1:]
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        if step == 0:
            start = time.perf_counter()
    return (steps - 1) * G * recipe.data.seq_len / (time.perf_counter() - start)


def trainguard_loop(recipe, steps: int) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        run_recipe(recipe, run_dir, progress=False, report=False)
        rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("kind") == "step"]
    tokens = (
        (len(rows) - 1) * recipe.train.batch_size * recipe.train.grad_accum * recipe.data.seq_len
    )
    return tokens / (rows[-1]["time"] - rows[0]["time"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(describe())
    overrides = [
        f"train.max_steps={args.steps}",
        f"train.eval_interval={args.steps}",
        f"checkpoint.interval={args.steps}",
        "train.eval_batches=1",
        "preflight.enabled=false",
    ]
    recipe = load_recipe("default", overrides)
    data = prepare_data(recipe.data, recipe.tokenizer, progress=False)
    ratios, plain, guarded = [], [], []
    for r in range(args.rounds):
        a = plain_loop(recipe, data, args.steps)
        b = trainguard_loop(recipe, args.steps)
        plain.append(a)
        guarded.append(b)
        ratios.append(b / a)
        print(f"round {r}: plain {a:,.0f} tok/s  trainguard {b:,.0f} tok/s  ratio {b / a:.3f}")
    print(
        f"median: plain {statistics.median(plain):,.0f} tok/s, trainguard "
        f"{statistics.median(guarded):,.0f} tok/s, ratio {statistics.median(ratios):.3f}"
    )


if __name__ == "__main__":
    main()
