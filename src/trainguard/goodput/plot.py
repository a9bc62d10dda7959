"""The planner's two plots (PNG, matplotlib Agg): ETTR against the number of GPUs, and against
the checkpoint interval with the simulation's points and 95% intervals beside the closed form."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainguard.goodput import model
from trainguard.goodput.plan import Plan
from trainguard.util.atomic import save_figures


def _gpu_grid(gpus: int) -> np.ndarray:
    top = max(gpus * 16, 100_000)
    return np.unique(np.round(np.geomspace(1, top, 40)).astype(np.int64))


def plot_plan(plan: Plan, paths: dict[str, Path]) -> list[Path]:
    """Write both plots (all or nothing) and return their paths."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    figs = []
    try:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        figs.append(fig)
        grid = _gpu_grid(plan.gpus)
        best, fixed = plan.gpu_curve(grid)
        ax.plot(grid, best, lw=1.5, label="each N at its own best interval")
        ax.plot(grid, fixed, lw=1, ls="--", label=f"every {plan.interval_steps} steps")
        ax.scatter([plan.gpus], [plan.expected.ettr], color="crimson", zorder=3, label="plan")
        ax.set_xscale("log")
        ax.set_xlabel("GPUs")
        ax.set_ylabel("expected ETTR")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"per-GPU MTBF {plan.gpu_mtbf_hours:,.0f} h", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()

        fig, ax = plt.subplots(figsize=(7, 4.2))
        figs.append(fig)
        k = plan.interval_steps
        ks = np.unique(np.round(np.geomspace(max(1, k / 30), k * 30, 200)).astype(np.int64))
        ettr = model.expected(plan.costs, ks, plan.mtbf_s)[0]
        ax.plot(ks, ettr, lw=1.5, label="closed form")
        if plan.simulated:
            sk = np.array([s.interval_steps for s in plan.simulated])
            se = np.array([s.ettr for s in plan.simulated])
            lo = se - np.array([s.ci95[0] for s in plan.simulated])
            hi = np.array([s.ci95[1] for s in plan.simulated]) - se
            ax.errorbar(sk, se, yerr=[lo, hi], fmt="o", ms=3, capsize=2, label="simulation")
        ax.axvline(plan.young_steps, color="grey", lw=0.8, ls=":", label="Young/Daly")
        ax.axvline(k, color="crimson", lw=0.8, ls="--", label=f"plan: {k} steps")
        ax.set_xscale("log")
        ax.set_xlabel("checkpoint interval (steps)")
        ax.set_ylabel("expected ETTR")
        ax.set_title(f"{plan.gpus} GPUs, job MTBF {plan.mtbf_s / 3600:.3g} h", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        targets = [paths["ettr_vs_gpus"], paths["ettr_vs_interval"]]
    except BaseException:
        for f in figs:
            plt.close(f)
        raise
    save_figures(figs, targets)
    return targets
