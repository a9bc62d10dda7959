"""Plot each variant's effect with its confidence interval, one panel per metric (PNG)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainguard.util.atomic import save_figures

_COLOURS = {"better": "tab:green", "worse": "tab:red"}


def plot_effects(variants: dict[str, Any], path: str | Path) -> Path:
    """variant - base per metric: a point at the mean difference, a bar over the interval,
    a line at zero; green better, red worse, grey no detectable difference."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    path = Path(path)
    lower = {e["metric"]: e["lower_is_better"] for v in variants.values() for e in v["effects"]}
    metrics = sorted(lower, key=lambda m: (m.startswith("ablation_"), m))  # use case first
    names = list(variants)
    fig, axes = plt.subplots(
        1,
        max(1, len(metrics)),
        figsize=(3.2 * max(1, len(metrics)), 0.5 * len(names) + 1.6),
        squeeze=False,
    )
    for ax, metric in zip(axes[0], metrics, strict=False):
        for y, name in enumerate(names):
            for e in variants[name]["effects"]:
                if e["metric"] != metric:
                    continue
                # One seed has no interval (NaN or infinite ends): the point alone.
                lo = e["low"] if math.isfinite(e["low"]) else e["diff"]
                hi = e["high"] if math.isfinite(e["high"]) else e["diff"]
                colour = _COLOURS.get(e["verdict"], "grey")
                ax.errorbar(
                    e["diff"],
                    y,
                    xerr=[[e["diff"] - lo], [hi - e["diff"]]],
                    fmt="o",
                    color=colour,
                    capsize=3,
                )
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_yticks(range(len(names)), names)
        direction = "lower is better" if lower[metric] else "higher is better"
        ax.set_title(f"{metric}\n(variant - base, {direction})", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    save_figures([fig], [path])
    return path
