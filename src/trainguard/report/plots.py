"""Plots for the run report, rendered to PNG bytes with matplotlib's Agg backend.

Training curves show what a line cannot: a non-finite value (NaN, inf; stored as "nan"/"inf"
strings in metrics.jsonl) is a red cross at the top edge (-inf at the bottom edge) at its step,
and each finding with a step is a triangle on the bottom edge, coloured by severity, with a
faint vertical line through the curve.
"""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SEVERITY_COLOURS = {"error": "#b00020", "warning": "#e69500", "info": "#0b5394"}
# Height of each severity's row of triangles, in axes fractions: findings of several
# severities at one step (R101 error, R206 warning, R201 info) stay visible side by side.
_SEVERITY_ROW = {"error": 0.0, "warning": 0.06, "info": 0.12}


def _value(y: Any) -> float | None:
    """A logged value as a float: numbers and the "nan"/"inf" strings JSON stores them as."""
    if isinstance(y, bool) or y is None:
        return None
    if isinstance(y, int | float):
        return float(y)
    if isinstance(y, str):
        try:
            return float(y)
        except ValueError:
            return None
    return None


def _finite(xs: list[Any], ys: list[Any]) -> tuple[list[float], list[float]]:
    pairs = [(float(x), v) for x, y in zip(xs, ys, strict=True) if (v := _value(y)) is not None]
    pairs = [(x, v) for x, v in pairs if math.isfinite(v)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _non_finite(xs: list[Any], ys: list[Any]) -> list[tuple[float, float]]:
    """(step, value) of every NaN/inf value."""
    out = []
    for x, y in zip(xs, ys, strict=True):
        v = _value(y)
        if v is not None and not math.isfinite(v):
            out.append((float(x), v))
    return out


def _mark_non_finite(ax: Any, points: list[tuple[float, float]], what: str) -> None:
    if not points:
        return
    edge = ax.get_xaxis_transform()  # x in data (steps), y in axes fractions (0 bottom, 1 top)
    ax.scatter(
        [x for x, _ in points],
        [0.02 if v == -math.inf else 0.97 for _, v in points],
        transform=edge,
        marker="X",
        s=60,
        color="#d62728",
        zorder=5,
        clip_on=False,
        label=f"non-finite {what} ({len(points)})",
        gid="non-finite",
    )
    for x, v in points:
        ax.annotate(
            "NaN" if math.isnan(v) else ("inf" if v > 0 else "-inf"),
            (x, 0.97 if v != -math.inf else 0.02),
            xycoords=edge,
            textcoords="offset points",
            xytext=(5, -10 if v != -math.inf else 4),
            fontsize=7,
            color="#d62728",
        )


def _mark_findings(ax: Any, findings: list[dict[str, Any]]) -> None:
    """A triangle per finding at its step near the bottom edge, coloured by severity."""
    edge = ax.get_xaxis_transform()
    by_severity: dict[str, list[float]] = {}
    for f in findings:
        step = _value(f.get("step"))
        if step is None or not math.isfinite(step):
            continue  # pre-flight findings have no step
        by_severity.setdefault(str(f.get("severity")), []).append(step)
    for severity in ("info", "warning", "error"):  # errors drawn last, on top
        steps = sorted(set(by_severity.get(severity, [])))
        if not steps:
            continue
        colour = SEVERITY_COLOURS[severity]
        for x in steps:
            ax.axvline(x, color=colour, lw=0.8, alpha=0.35, zorder=1)
        n = len(by_severity[severity])
        ax.scatter(
            steps,
            [_SEVERITY_ROW[severity]] * len(steps),
            transform=edge,
            marker="^",
            s=50,
            color=colour,
            edgecolor="black",
            linewidth=0.4,
            zorder=6,
            clip_on=False,
            label=f"{severity} finding{'s' if n > 1 else ''} ({n})",
            gid=f"findings-{severity}",
        )


def _curve(
    ax: Any, rows: list[dict[str, Any]], key: str, findings: list[dict[str, Any]], **style: Any
) -> None:
    """One training curve: finite values as a line, non-finite ones and findings as marks."""
    xs, ys = [r["step"] for r in rows], [r.get(key) for r in rows]
    values = [_value(y) for y in ys]
    # A non-finite value breaks the line (matplotlib leaves a gap at NaN) rather than being
    # bridged over as if the step were fine.
    line = [v if v is not None and math.isfinite(v) else math.nan for v in values]
    ax.plot([float(x) for x in xs], line, **style)
    _mark_non_finite(ax, _non_finite(xs, ys), key)
    _mark_findings(ax, findings)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def loss_plot(
    steps: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    findings: list[dict[str, Any]] | None = None,
) -> bytes:
    return _png(loss_figure(steps, evals, findings))


def loss_figure(
    steps: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    findings: list[dict[str, Any]] | None = None,
) -> Any:
    """Train and validation loss; every finding with a step is marked (the run's overview).
    The marks are scatter collections with gid `non-finite` and `findings-<severity>`."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    _curve(ax, steps, "loss", findings or [], lw=0.8, alpha=0.8, label="train loss")
    ex, ey = _finite([r["step"] for r in evals], [r.get("val_loss") for r in evals])
    if ex:
        ax.plot(ex, ey, "o-", color="C3", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Loss")
    return fig


def series_plot(
    steps: list[dict[str, Any]],
    key: str,
    title: str,
    ylabel: str,
    findings: list[dict[str, Any]] | None = None,
) -> bytes:
    return _png(series_figure(steps, key, title, ylabel, findings))


def series_figure(
    steps: list[dict[str, Any]],
    key: str,
    title: str,
    ylabel: str,
    findings: list[dict[str, Any]] | None = None,
) -> Any:
    """One step metric; marks its non-finite values and the findings about it (`metric`)."""
    fig, ax = plt.subplots(figsize=(7, 2.8))
    own = [f for f in findings or [] if f.get("metric") == key]
    _curve(ax, steps, key, own, lw=0.8, color="C2")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return fig


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


MOE_CODES = ("R601", "R602", "R603", "R604")


def moe_figure(steps: list[dict[str, Any]], findings: list[dict[str, Any]] | None = None) -> Any:
    """MoE router health (R601-R604): the busiest and idlest expert's load (share of its layer's
    assignments x n_experts, worst layer; 1 is balanced, 0 a dead expert) on the left axis, the
    worst layer's dropped share on the right; the MoE findings marked at their steps."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    own = [f for f in findings or [] if f.get("code") in MOE_CODES]
    _curve(ax, steps, "moe_load_max", own, lw=0.8, color="C0", label="busiest expert load")
    _curve(ax, steps, "moe_load_min", [], lw=0.8, color="C1", label="idlest expert load")
    ax.axhline(1.0, color="grey", lw=0.6, ls=":")
    ax.set_ylabel("load (1 = balanced)")
    right = ax.twinx()
    _curve(right, steps, "moe_drop_frac", [], lw=0.8, color="C3", label="dropped share")
    right.set_ylabel("dropped share")
    right.set_ylim(0, 1)
    handles = ax.get_legend_handles_labels()
    extra = right.get_legend_handles_labels()
    ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=8)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.set_title("MoE routers")
    return fig


def data_share_figure(
    steps: list[dict[str, Any]], findings: list[dict[str, Any]] | None = None
) -> Any:
    """The data phase's share of each step (`data_time_s / step_time_s`), R605 marked."""
    rows = [
        {"step": r["step"], "data_share": d / t}
        for r in steps
        if (d := _value(r.get("data_time_s"))) is not None
        and (t := _value(r.get("step_time_s"))) is not None
        and math.isfinite(d / t if t else math.nan)
    ]
    fig, ax = plt.subplots(figsize=(7, 2.8))
    own = [f for f in findings or [] if f.get("code") == "R605"]
    _curve(ax, rows, "data_share", own, lw=0.8, color="C4")
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("share of the step")
    ax.grid(alpha=0.3)
    ax.set_title("Data phase (loader)")
    return fig


def health_plots(
    steps: list[dict[str, Any]], findings: list[dict[str, Any]]
) -> list[tuple[str, bytes]]:
    """The MoE and data-phase plots, for the runs whose step rows have their columns."""
    out = []
    if any("moe_load_max" in r for r in steps):
        out.append(("moe", _png(moe_figure(steps, findings))))
    if any("data_time_s" in r for r in steps):
        out.append(("data phase", _png(data_share_figure(steps, findings))))
    return out


# Goodput categories in the order they are stacked, with their colours: productive first.
GOODPUT_COLORS = {
    "productive": "#2ca02c",
    "data_wait": "#98df8a",
    "checkpoint": "#1f77b4",
    "eval": "#aec7e8",
    "startup": "#9467bd",
    "restart": "#d62728",
    "redone": "#ff7f0e",
    "skipped": "#ffbb78",
    "other": "#c7c7c7",
}


def goodput_figure(goodput: dict[str, Any]) -> Any:
    """Where the wall time went (`goodput.accounting`), as one stacked bar with the share of
    each category written on it (the shares under 3% in the legend only)."""
    shares = goodput.get("shares") or {}
    fig, ax = plt.subplots(figsize=(7, 1.7))
    left = 0.0
    for name, color in GOODPUT_COLORS.items():
        share = _value(shares.get(name)) or 0.0
        if share <= 0:
            continue
        ax.barh([0], [share], left=left, color=color, label=f"{name} {share:.1%}")
        if share >= 0.03:
            ax.text(left + share / 2, 0, f"{share:.0%}", ha="center", va="center", fontsize=8)
        left += share
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    wall = _value(goodput.get("wall_s")) or 0.0
    ax.set_title(f"Goodput: {wall:.1f} s of wall time, {goodput.get('attempts', 0)} process(es)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    return fig


def goodput_plot(goodput: dict[str, Any]) -> bytes:
    return _png(goodput_figure(goodput))
