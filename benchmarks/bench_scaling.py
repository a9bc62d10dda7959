"""Scaling-law fit plus bootstrap refits: batched L-BFGS vs one scipy L-BFGS-B call per start.

Goal (issue 7): fit + 200 bootstrap refits on 30 runs within 10 seconds on this machine.
Both sides do the same work on the same synthetic runs (Besiroglu et al. 2024 constants, 0.5%
log-normal noise): the main fit from the 128 best grid starts, then for every bootstrap
resample L-BFGS from the full-data optimum and the resample's 2 best grid points.

    .venv/bin/python benchmarks/bench_scaling.py --repeats 1 \\
        --markdown docs/benchmarks/evals_scaling.md

Medians over repeats of wall time; the ratio is baseline / candidate (the speed-up).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from machine import describe  # noqa: E402

from trainguard.scaling.fit import (  # noqa: E402
    ScalingLaw,
    _huber,
    _log_pred,
    fit_scaling_law,
    grid_objectives,
    init_grid,
    objective,
)

TRUTH = ScalingLaw(E=1.82, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)


def runs(n_runs: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    n = np.exp(rng.uniform(np.log(1e7), np.log(3e9), n_runs))
    d = np.exp(rng.uniform(np.log(3e8), np.log(3e11), n_runs))
    return n, d, TRUTH.predict(n, d) * np.exp(rng.normal(0, 0.005, n_runs))


def _scipy_best(starts, args):
    best = None
    for x0 in starts:
        r = minimize(
            objective,
            x0,
            args=args,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 1000, "ftol": 1e-15, "gtol": 1e-12},
        )
        if best is None or r.fun < best.fun:
            best = r
    return best.x


def baseline(n, d, loss, n_boot, n_starts=128, boot_starts=2, seed=0):
    """The straightforward way: one scipy call per start, one resample at a time."""
    ln, ld, ll = np.log(n), np.log(d), np.log(loss)
    grid = init_grid()
    starts = grid[np.argsort(grid_objectives(grid, ln, ld, ll))[:n_starts]]
    theta = _scipy_best(starts, (ln, ld, ll, 1e-3))
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(ln), len(ln))
        a = (ln[idx], ld[idx], ll[idx], 1e-3)
        pred, _ = _log_pred(grid, a[0], a[1])
        top = np.argsort(_huber(pred - a[2][None, :], 1e-3).sum(1))[:boot_starts]
        boot.append(_scipy_best(np.vstack([theta[None], grid[top]]), a))
    return ScalingLaw.from_theta(theta), np.array(boot)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--boot", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--markdown", type=Path, help="write a markdown section here")
    args = ap.parse_args()
    print(describe())
    n, d, loss = runs(args.runs)
    cand_t, base_t = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        res = fit_scaling_law(n, d, loss, n_boot=args.boot)
        cand_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        law_b, boot_b = baseline(n, d, loss, args.boot)
        base_t.append(time.perf_counter() - t)
    c, b = statistics.median(cand_t), statistics.median(base_t)
    lo, hi = np.quantile([ScalingLaw.from_theta(x).alpha for x in res.boot], [0.025, 0.975])
    lob, hib = np.quantile([ScalingLaw.from_theta(x).alpha for x in boot_b], [0.025, 0.975])
    lines = [
        f"fit + {args.boot} bootstrap refits on {args.runs} runs, median of {args.repeats}:",
        f"  candidate (batched numpy L-BFGS + scipy polish): {c:.2f} s",
        f"  baseline  (one scipy L-BFGS-B call per start):   {b:.2f} s",
        f"  speed-up: {b / c:.1f}x; goal < 10 s: {'met' if c < 10 else 'NOT met'}",
        f"  fit: {res.law.to_dict()}",
        f"  baseline fit: {law_b.to_dict()}",
        f"  alpha 95% band: candidate [{lo:.4f}, {hi:.4f}], baseline [{lob:.4f}, {hib:.4f}]",
    ]
    print("\n".join(lines))
    if args.markdown:
        cmd = (
            f".venv/bin/python benchmarks/bench_scaling.py --runs {args.runs} "
            f"--boot {args.boot} --repeats {args.repeats}"
        )
        section = [
            "## Scaling-law fit + bootstrap",
            "",
            f"`{cmd}`",
            "",
            "| | median wall time (s) |",
            "|---|---|",
            f"| candidate: batched numpy L-BFGS, scipy polish of the best start | {c:.2f} |",
            f"| baseline: one scipy L-BFGS-B call per start and resample | {b:.2f} |",
            f"| speed-up (baseline / candidate) | {b / c:.1f}x |",
            "",
            f"Goal: under 10 s. Same starts, same resamples. 95% bootstrap band of alpha: "
            f"candidate [{lo:.4f}, {hi:.4f}], baseline [{lob:.4f}, {hib:.4f}].",
            "",
        ]
        with open(args.markdown, "a", encoding="utf-8") as f:
            f.write("\n".join(section) + "\n")


if __name__ == "__main__":
    main()
