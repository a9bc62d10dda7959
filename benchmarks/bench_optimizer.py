"""Validation loss per step budget: Muon (the default recipe) against AdamW, side by side.

Each configuration is a real `trainguard run` of the default recipe (same data, seed, model and
schedule shape), with pre-flight, use-case evals and the report left out so that the wall time
is training plus the periodic validation and checkpoints. The runs are deterministic on CPU, so
the losses repeat exactly; only the times are noisy.

    python benchmarks/bench_optimizer.py [--configs adamw:500,adamw:300,muon:300]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from trainguard.config import load_recipe
from trainguard.train.run import run_recipe


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="adamw:500,adamw:300,muon:300")
    args = ap.parse_args()
    results = []
    for item in args.configs.split(","):
        optimizer, steps = item.split(":")
        loss, wall = run_one(optimizer, int(steps))
        results.append((optimizer, int(steps), loss, wall))
        print(f"{optimizer:>5} {int(steps):>4} steps: val_loss {loss:.4f}  wall {wall:6.1f} s")
    base = results[0]
    print(f"\nratios to {base[0]} {base[1]} steps:")
    for optimizer, steps, loss, wall in results[1:]:
        print(
            f"{optimizer:>5} {steps:>4} steps: val_loss {loss - base[2]:+.4f} nats, "
            f"wall {wall / base[3]:.2f}x"
        )


if __name__ == "__main__":
    main()
