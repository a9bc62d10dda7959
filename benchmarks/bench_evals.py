"""Eval throughput of the default recipe's use-case eval (python_next_line), examples/second.

The default recipe's model shape (4 layers, d_model 128, 4 heads, seq_len 128) with a
byte-level BPE (vocab 4096) trained on the validation documents, on CPU. Side by side:
- candidate: `run_evals` as the run calls it (requests batched by length, 32 per forward);
- baseline: the same requests scored one forward per (context, choice), as a naive loop does.
Both score the same examples and must agree on accuracy.

    .venv/bin/python benchmarks/bench_evals.py --examples 100 --repeats 3 \\
        --markdown docs/benchmarks/evals_scaling.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from machine import describe

from trainguard.config.schema import DataConfig, ModelConfig  # noqa: E402
from trainguard.data.tokenizer import train_tokenizer  # noqa: E402
from trainguard.evals import builtin  # noqa: E402
from trainguard.evals.runner import run_evals, score_multiple_choice, task_rows  # noqa: E402
from trainguard.evals.scoring import (  # noqa: E402
    encode_context,
    encode_continuation,
    loglikelihoods,
)
from trainguard.evals.spec import load_spec  # noqa: E402
from trainguard.model.gpt import GPT  # noqa: E402


def baseline_acc(model, tok, rows) -> float:
    correct = 0
    for row in rows:
        ctx = encode_context(tok, "<|endoftext|>", row["context"])
        lls = [
            loglikelihoods(model, [(ctx, encode_continuation(tok, c))], batch_size=1)[0][0]
            for c in row["choices"]
        ]
        correct += max(range(len(lls)), key=lls.__getitem__) == row["gold"]
    return correct / len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    print(describe())
    torch.set_num_threads(args.threads)
    data = DataConfig()  # stdlib, val_fraction 0.05: the default recipe's split
    t = time.perf_counter()
    docs = builtin._val_docs(data.source, data.text_field, data.val_fraction)
    build_s = time.perf_counter() - t
    tok = train_tokenizer((text for _, text in docs), vocab_size=4096)
    torch.manual_seed(0)
    model = GPT(ModelConfig(), tok.get_vocab_size(), 128).eval()
    spec = load_spec("python_next_line")
    rows = task_rows(spec, spec.tasks[0], data, args.examples)  # exactly what run_evals scores
    run_evals(model, tok, ["python_next_line"], max_examples=4, data=data)  # warm-up
    cand, base = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        res = run_evals(model, tok, ["python_next_line"], max_examples=args.examples, data=data)
        cand.append(time.perf_counter() - t)
        t = time.perf_counter()
        acc_b = baseline_acc(model, tok, rows)
        base.append(time.perf_counter() - t)
    acc_c = res.metrics["python_next_line/acc"]
    assert abs(acc_c - acc_b) < 1e-9, (acc_c, acc_b)
    assert acc_c == score_multiple_choice(model, tok, "<|endoftext|>", rows, "cpu")["acc"]
    c, b = statistics.median(cand), statistics.median(base)
    n = len(rows)
    lines = [
        f"python_next_line, {n} examples x 4 choices, {args.threads} thread(s), "
        f"median of {args.repeats}:",
        f"  candidate (batched run_evals): {n / c:.1f} examples/s ({c:.2f} s)",
        f"  baseline (one forward per choice): {n / b:.1f} examples/s ({b:.2f} s)",
        f"  speed-up: {b / c:.2f}x; accuracy {acc_c:.3f} (untrained model, chance 0.25)",
        f"  reading the stdlib validation split once (cached afterwards): {build_s:.2f} s",
    ]
    print("\n".join(lines))
    if args.markdown:
        cmd = (
            f".venv/bin/python benchmarks/bench_evals.py --examples {args.examples} "
            f"--repeats {args.repeats} --threads {args.threads}"
        )
        section = [
            "## Eval throughput: the default recipe's use-case eval",
            "",
            f"`{cmd}`",
            "",
            "| | examples/s | median s |",
            "|---|---|---|",
            f"| candidate: `run_evals` (batched by length, 32 per forward) | {n / c:.1f} | "
            f"{c:.2f} |",
            f"| baseline: one forward per (context, choice) | {n / b:.1f} | {b:.2f} |",
            f"| speed-up | {b / c:.2f}x | |",
            "",
            f"Default recipe model shape (4 x 128, seq_len 128, vocab 4096), CPU, {n} examples of "
            "4 choices; both sides agree on accuracy. Reading the stdlib validation split takes "
            f"{build_s:.2f} s once per process (cached).",
            "",
        ]
        with open(args.markdown, "a", encoding="utf-8") as f:
            f.write("\n".join(section) + "\n")


if __name__ == "__main__":
    main()
