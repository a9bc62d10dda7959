"""Plot the gating runs, the fitted law and its bootstrap band (PNG, matplotlib Agg)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainguard.scaling.fit import FitResult
from trainguard.util.atomic import save_figures


def plot_fit(
    fit: FitResult,
    params: np.ndarray,
    tokens: np.ndarray,
    losses: np.ndarray,
    path: str | Path,
    predictions: list[dict] | None = None,
) -> Path:
    """Loss against tokens, one colour per model size: data points, fitted curve, band."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = np.unique(params)
    cmap = plt.get_cmap("viridis", max(2, len(sizes)))
    d_max = max([float(tokens.max()), *(p["tokens"] for p in predictions or [])]) * 1.5
    grid = np.geomspace(tokens.min() / 1.5, d_max, 100)
    for i, n in enumerate(sizes):
        sel = params == n
        ax.scatter(tokens[sel], losses[sel], color=cmap(i), s=18, label=f"N={n:.3g}")
        loss, low, high = fit.band(np.full_like(grid, n), grid)
        ax.plot(grid, loss, color=cmap(i), lw=1)
        ax.fill_between(grid, low, high, color=cmap(i), alpha=0.15, lw=0)
    for p in predictions or []:
        ax.errorbar(
            p["tokens"],
            p["loss"],
            yerr=[[p["loss"] - p["low"]], [p["high"] - p["loss"]]],
            fmt="*",
            color="crimson",
            ms=10,
            capsize=3,
        )
        ax.annotate(
            f"N={p['params']:.3g}",
            (p["tokens"], p["loss"]),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    law = fit.law
    ax.set_xscale("log")
    ax.set_xlabel("training tokens D")
    ax.set_ylabel("final validation loss")
    ax.set_title(
        f"L = {law.E:.3g} + {law.A:.3g}/N^{law.alpha:.3f} + {law.B:.3g}/D^{law.beta:.3f}",
        fontsize=9,
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_figures([fig], [path])
    return path
