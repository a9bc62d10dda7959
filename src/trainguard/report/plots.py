"""Plots for the run report, rendered to PNG bytes with matplotlib's Agg backend."""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _finite(xs: list[Any], ys: list[Any]) -> tuple[list[float], list[float]]:
    pairs = [
        (float(x), float(y))
        for x, y in zip(xs, ys, strict=True)
        if isinstance(y, int | float) and math.isfinite(y)
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def loss_plot(steps: list[dict[str, Any]], evals: list[dict[str, Any]]) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x, y = _finite([r["step"] for r in steps], [r.get("loss") for r in steps])
    ax.plot(x, y, lw=0.8, alpha=0.8, label="train loss")
    ex, ey = _finite([r["step"] for r in evals], [r.get("val_loss") for r in evals])
    if ex:
        ax.plot(ex, ey, "o-", color="C3", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Loss")
    return _png(fig)


def series_plot(steps: list[dict[str, Any]], key: str, title: str, ylabel: str) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 2.8))
    x, y = _finite([r["step"] for r in steps], [r.get(key) for r in steps])
    ax.plot(x, y, lw=0.8, color="C2")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return _png(fig)


def eval_metrics_plot(evals: list[dict[str, Any]], keys: list[str]) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for key in keys:
        x, y = _finite([r["step"] for r in evals], [r.get(key) for r in evals])
        ax.plot(x, y, "o-", label=key)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Evaluations")
    return _png(fig)


def prediction_plot(band: dict[str, Any], evals: list[dict[str, Any]]) -> bytes:
    """The run's validation loss against the loss band a scaling-law fit predicted for it."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.fill_between(band["tokens"], band["low"], band["high"], alpha=0.25, label="predicted band")
    ax.plot(band["tokens"], band["loss"], "--", color="C0", label="prediction")
    x, y = _finite([r.get("tokens", 0) for r in evals], [r.get("val_loss") for r in evals])
    ax.plot(x, y, "o-", color="C3", label="validation loss")
    ax.set_xscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Scaling-law prediction ({band['params']:.3g} parameters)")
    return _png(fig)
