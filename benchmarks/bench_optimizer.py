"""Validation loss per step budget: Muon (the default recipe) against AdamW, side by side.

Each configuration is a real `trainguard run` of the default recipe (same data, seed, model and
schedule shape), with pre-flight, use-case evals and the report left out so that the wall time
is training plus the periodic validation and checkpoints. The runs are deterministic on CPU, so
the losses repeat exactly; only the times are noisy.

It also times one optimizer step over the default model's hidden matrices with trainguard's
`Muon` (fp32 Newton-Schulz on CPU) against `torch.optim.Muon` (bfloat16 Newton-Schulz, where
this torch has it), alternating rounds, same gradients. Which is faster depends on the CPU:
bf16 matrix products are fast only with bf16 units (`avx512_bf16`, AMX), so the machine line
(machine.py) is printed first and belongs next to the figure.

    python benchmarks/bench_optimizer.py [--configs adamw:500,adamw:300,muon:300] [--rounds 5]
    python benchmarks/bench_optimizer.py --configs "" --rounds 5   # the step timing only
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from machine import describe

from trainguard.config import load_recipe
from trainguard.model.gpt import GPT
from trainguard.train.guarded_run import run_recipe
from trainguard.train.optim import Muon, orthogonalize, split_params


def run_one(optimizer: str, steps: int) -> tuple[float, float]:
    """(final validation loss, wall seconds) of the default recipe with these settings."""
    overrides = [
        f"train.optimizer={optimizer}",
        f"train.max_steps={steps}",
        f"train.warmup_steps={max(1, steps // 10)}",  # 10% warm-up, as the default recipe
        "preflight.enabled=false",
    ]
    recipe = load_recipe("default", overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.perf_counter()
        result = run_recipe(recipe, run_dir, progress=False, report=False, evals=False)
        wall = time.perf_counter() - start
    assert result.final_val_loss is not None
    return result.final_val_loss, wall


def muon_step_seconds(make_optimizer, matrices: list[torch.nn.Parameter], steps: int) -> float:
    """Median seconds of one optimizer step over `matrices` (gradients fixed and random)."""
    gen = torch.Generator().manual_seed(0)
    for p in matrices:
        p.grad = torch.randn(p.shape, generator=gen)
    opt = make_optimizer(matrices)
    opt.step()  # first step allocates the momentum buffers
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def precision(matrices: list[torch.nn.Parameter]) -> None:
    """How far the Newton-Schulz result lands from the same iteration in float64, in fp32 (ours
    on CPU) and bf16 (torch.optim.Muon's, ours on CUDA): median relative error over matrices."""
    gen = torch.Generator().manual_seed(1)
    errors: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for p in matrices:
        g = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        ref = orthogonalize(g, dtype=torch.float64)
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            out = orthogonalize(g, dtype=dtype).to(torch.float64)
            errors[name].append(float((out - ref).norm() / ref.norm()))
    print("Newton-Schulz relative error to float64 (median over the matrices):")
    for name, values in errors.items():
        print(f"  {name}: {statistics.median(values):.2e}")
    print()


def step_timing(rounds: int, steps: int = 10) -> None:
    recipe = load_recipe("default")
    t = recipe.train
    model = GPT(recipe.model, recipe.tokenizer.vocab_size, recipe.data.seq_len)
    matrices, _, _ = split_params(model)
    precision(matrices)
    if not hasattr(torch.optim, "Muon"):
        print(f"torch {torch.__version__} has no torch.optim.Muon: no step comparison\n")
        return
    candidates = {
        "trainguard Muon (fp32 NS)": lambda ps: Muon(ps, lr=t.muon_lr, weight_decay=0.0),
        "torch.optim.Muon (bf16 NS)": lambda ps: torch.optim.Muon(ps, lr=t.muon_lr),
    }
    medians: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):  # alternate, so machine noise hits both
        for name, make in candidates.items():
            medians[name].append(muon_step_seconds(make, matrices, steps))
    ours, ref = (statistics.median(v) for v in medians.values())
    print(f"optimizer step over {len(matrices)} hidden matrices, median of {rounds} rounds:")
    for name, values in medians.items():
        print(f"  {name}: {statistics.median(values) * 1e3:.1f} ms")
    print(f"  torch.optim.Muon / trainguard Muon: {ref / ours:.1f}x\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="adamw:500,adamw:300,muon:300")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the Muon step timing")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for the step timing (1: steady on a shared machine, "
        "where OpenMP threads that wait for a busy core slow both optimizers many times)",
    )
    args = ap.parse_args()
    print(describe(), "\n")
    torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}")
    step_timing(args.rounds)
    results = []
    for item in filter(None, args.configs.split(",")):
        optimizer, steps = item.split(":")
        loss, wall = run_one(optimizer, int(steps))
        results.append((optimizer, int(steps), loss, wall))
        print(f"{optimizer:>5} {int(steps):>4} steps: val_loss {loss:.4f}  wall {wall:6.1f} s")
    if not results:
        return
    base = results[0]
    print(f"\nratios to {base[0]} {base[1]} steps:")
    for optimizer, steps, loss, wall in results[1:]:
        print(
            f"{optimizer:>5} {steps:>4} steps: val_loss {loss - base[2]:+.4f} nats, "
            f"wall {wall / base[3]:.2f}x"
        )


if __name__ == "__main__":
    main()
