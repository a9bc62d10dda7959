"""check-model on the default recipe's model: passes and seconds per check, side by side.

Candidate: `run_model_checks` as shipped (one cut point per batch row when the model is
batch-independent). Baseline, in the same run: the same checks with every cut point in its
own forward/backward (`batch_cuts=False`, the fallback for batch-dependent models). Also one
training step's forward+backward at the recipe's batch shape, as a unit of cost.

    .venv/bin/python benchmarks/bench_check_model.py --repeats 3 --threads 1 \\
        --markdown docs/benchmarks/check_model.md

Medians over repeats; ratios are candidate / baseline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from machine import describe

from trainguard.checks.model_checks import run_model_checks  # noqa: E402
from trainguard.config.load import load_recipe  # noqa: E402
from trainguard.model.gpt import GPT  # noqa: E402


def precision_table() -> str:
    """Bias / noise of each simulated reduction (4096 gradient entries, seed 0)."""
    from trainguard.numerics.reduction import audit_reduction

    lines = [
        "| dtype | world size | ring bias / noise | tree bias / noise | "
        "fp32-accumulate bias / noise | seconds (all 3) |",
        "|---|---|---|---|---|---|",
    ]
    grid = (("fp32", (8, 512, 4096)), ("bf16", (8, 64, 512, 4096)), ("fp16", (8, 512, 4096)))
    for dtype, worlds in grid:
        for world in worlds:
            t0, cells = time.perf_counter(), []
            for alg in ("ring", "tree", "fp32-accumulate"):
                a = audit_reduction(dtype, world, alg, 4096, 0)
                mark = (" **N101**" if a.biased else "") + (" N102" if a.noisy else "")
                cells.append(f"{a.bias:.1e} / {a.noise:.1e}{mark}")
            seconds = time.perf_counter() - t0
            lines.append(f"| {dtype} | {world} | " + " | ".join(cells) + f" | {seconds:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dtype", default=None, help="also run the precision audit (bf16, fp16)")
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument(
        "--precision-table", action="store_true", help="print the reduction outcome table only"
    )
    args = ap.parse_args()
    print(describe())
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.precision_table:
        print(precision_table())
        return
    recipe = load_recipe("default")
    vocab, t = recipe.tokenizer.vocab_size, recipe.data.seq_len
    torch.manual_seed(0)
    model = GPT(recipe.model, vocab, t)
    n_params = sum(p.numel() for p in model.parameters())

    def train_step() -> float:
        x = torch.randint(0, vocab, (recipe.train.batch_size, t + 1))
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    rows: dict[str, list] = {"candidate": [], "baseline": [], "step": []}
    reports = {}
    for _ in range(args.repeats):
        for name, batch_cuts in (("candidate", True), ("baseline", False)):
            t0 = time.perf_counter()
            rep = run_model_checks(model, vocab, t, dtype=args.dtype, batch_cuts=batch_cuts)
            rows[name].append(time.perf_counter() - t0)
            reports[name] = rep
        rows["step"].append(train_step())
    med = {k: statistics.median(v) for k, v in rows.items()}
    lines = [
        "## check-model on the default recipe's model",
        "",
        f"GPT n_layers={recipe.model.n_layers} d_model={recipe.model.d_model} "
        f"n_heads={recipe.model.n_heads}, vocab {vocab}, seq_len {t}, {n_params / 1e6:.2f} M "
        f"parameters; check batch 4, 16 cut points, train and eval mode; torch "
        f"{torch.__version__}, {torch.get_num_threads()} thread(s); median of {args.repeats}.",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_check_model.py --repeats {args.repeats}"
        + (f" --threads {args.threads}" if args.threads else "")
        + (f" --dtype {args.dtype}" if args.dtype else "")
        + "`",
        "",
        "| check | forwards | backwards | seconds (candidate) | baseline: one cut per pass |",
        "|---|---|---|---|---|",
    ]
    cand, base = reports["candidate"], reports["baseline"]
    for name, s in cand.stats.items():
        b = base.stats.get(name)
        lines.append(
            f"| {name} | {s.forwards} | {s.backwards} | {s.seconds:.2f} | "
            f"{b.forwards if b else '-'} fwd / {b.backwards if b else '-'} bwd |"
        )
    lines += [
        "",
        f"- whole check-model (candidate): **{med['candidate']:.2f} s** (target: under 10 s)",
        f"- baseline, one cut point per pass: {med['baseline']:.2f} s; ratio candidate / "
        f"baseline = **{med['candidate'] / med['baseline']:.2f}**",
        f"- one training step (batch {recipe.train.batch_size}, forward+backward): "
        f"{med['step']:.3f} s; check-model = {med['candidate'] / med['step']:.1f} steps",
        f"- findings: {[f.code for f in cand.findings] or 'none'}",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
