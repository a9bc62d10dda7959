"""`RUN_DIR/report.html` (self-contained, plots embedded) and `RUN_DIR/report.md`.

Everything comes from files in the run dir (metrics.jsonl, recipe.yaml, checkpoints), so
`trainguard report RUN_DIR` regenerates the same report at any time.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import yaml

from trainguard.checkpoint.folder import inspect_local_folder
from trainguard.checkpoint.local import scan_root
from trainguard.checkpoint.manifest import step_dirname
from trainguard.checkpoint.target import run_checkpoint_root
from trainguard.errors import BadInputError
from trainguard.metrics.jsonl import METRICS_FILE, read_metrics
from trainguard.report import plots
from trainguard.util.atomic import atomic_write_text

# Columns of "evals" rows that are bookkeeping, not metrics to plot.
_EVALS_BOOKKEEPING = {"kind", "step", "eval_seconds"}

_CSS = """
body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.9em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4} .error{color:#b00020;font-weight:600} .warning{color:#a15c00}
.info{color:#0b5394} img{max-width:100%} code,pre{background:#f6f6f6;padding:.1em .3em}
"""


def _checkpoints(run_dir: Path) -> list[dict[str, Any]]:
    """Every entry of a local checkpoint root: step folders verified in full (checksums
    included), anything else listed as ignored (C110). Never raises on what is in there."""
    root = run_checkpoint_root(run_dir)
    if "://" in root and not root.startswith("file://"):
        return []  # an object store: listing it is `trainguard eval`'s job, not the report's
    root_path = Path(root.removeprefix("file://"))
    steps, ignored = scan_root(root_path)
    rows = []
    for step in sorted(steps):
        folder = root_path / step_dirname(step)
        manifest, findings = inspect_local_folder(folder, step)
        errors = [f for f in findings if f.severity == "error"]
        size = sum(e["size"] for e in manifest["files"].values()) if manifest else 0
        rows.append(
            {
                "step": step,
                "path": str(folder),
                "bytes": size,
                "valid": not errors,
                "problem": "; ".join(f"{f.code} {f.message}" for f in errors),
            }
        )
    for name, why in ignored:
        rows.append(
            {
                "step": name,
                "path": str(root_path / name),
                "bytes": 0,
                "valid": False,
                "problem": f"C110 ignored, not a checkpoint: {why}",
            }
        )
    return rows


def collect(run_dir: Path) -> dict[str, Any]:
    if not (run_dir / METRICS_FILE).exists():
        raise BadInputError(
            f"{run_dir} has no {METRICS_FILE}: it is not a trainguard run dir",
            "pass the folder that `trainguard run` wrote (default runs/<recipe name>)",
        )
    rows = read_metrics(run_dir)
    recipe_path = run_dir / "recipe.yaml"
    recipe = yaml.safe_load(recipe_path.read_text()) if recipe_path.exists() else {}
    events = [r for r in rows if r.get("kind") == "event"]
    env = next((e.get("env") for e in events if e.get("event") == "start"), {}) or {}
    return {
        "run_dir": run_dir,
        "recipe": recipe,
        "steps": [r for r in rows if r.get("kind") == "step"],
        "evals": [r for r in rows if r.get("kind") == "eval"],
        "use_case": [r for r in rows if r.get("kind") == "evals"],
        "band": _band(recipe),
        "findings": [r for r in rows if r.get("kind") == "finding"],
        "events": events,
        "env": env,
        "checkpoints": _checkpoints(run_dir),
    }


def _band(recipe: dict[str, Any]) -> dict[str, Any] | None:
    path = (recipe.get("prediction") or {}).get("band")
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary(info: dict[str, Any]) -> dict[str, Any]:
    steps, evals = info["steps"], info["evals"]
    last = steps[-1] if steps else {}
    tps = sorted(r["tokens_per_s"] for r in steps if isinstance(r.get("tokens_per_s"), float))
    return {
        "recipe": info["recipe"].get("name", "?"),
        "steps": last.get("step", 0),
        "final train loss": last.get("loss"),
        "final val loss": evals[-1]["val_loss"] if evals else None,
        "final val bits/byte": evals[-1]["val_bpb"] if evals else None,
        "median tokens/s": tps[len(tps) // 2] if tps else None,
        "findings": len(info["findings"]),
        "checkpoints": len(info["checkpoints"]),
    }


def _fmt(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else html.escape(str(v))


def render_html(info: dict[str, Any]) -> str:
    steps, evals = info["steps"], info["evals"]
    parts = [f"<h1>trainguard run report: {html.escape(str(info['run_dir']))}</h1>"]
    parts.append(_table(["", "value"], [[k, _fmt(v)] for k, v in _summary(info).items()]))
    if steps:
        parts.append("<h2>Training</h2>")
        marks = info["findings"]  # drawn at their steps by plots.py
        parts.append(_img(plots.loss_plot(steps, evals, marks), "loss"))
        grad = plots.series_plot(steps, "grad_norm", "Gradient norm", "norm", marks)
        parts.append(_img(grad, "grad"))
        tps = plots.series_plot(steps, "tokens_per_s", "Throughput", "tokens/s", marks)
        parts.append(_img(tps, "throughput"))
    use_case = info["use_case"]
    # Plot the scores; "/n" columns are example counts.
    keys = sorted(
        {k for e in use_case for k, v in e.items() if isinstance(v, float) and not k.endswith("/n")}
        - _EVALS_BOOKKEEPING
    )
    if keys:
        parts.append("<h2>Use-case evaluations</h2>")
        parts.append(_img(plots.eval_metrics_plot(use_case, keys), "evals"))
        last = use_case[-1]
        parts.append(
            _table(["metric", f"step {last['step']}"], [[k, _fmt(last.get(k))] for k in keys])
        )
    if info["band"]:
        parts.append("<h2>Scaling-law prediction</h2>")
        parts.append(_img(plots.prediction_plot(info["band"], evals), "prediction"))
    parts.append("<h2>Findings</h2>")
    if info["findings"]:
        rows = [
            [
                html.escape(f["code"]),
                f'<span class="{f["severity"]}">{f["severity"]}</span>',
                _fmt(f.get("step")),
                html.escape(f["message"]),
                html.escape(f.get("fix") or ""),
            ]
            for f in info["findings"]
        ]
        parts.append(_table(["code", "severity", "step", "message", "fix"], rows))
    else:
        parts.append("<p>No findings.</p>")
    parts.append("<h2>Checkpoints</h2>")
    parts.append(
        _table(
            ["step", "valid", "MB", "path", "problem"],
            [
                [
                    _fmt(c["step"]),
                    _fmt(c["valid"]),
                    f"{c['bytes'] / 1e6:.1f}",
                    _fmt(c["path"]),
                    _fmt(c["problem"]),
                ]
                for c in info["checkpoints"]
            ],
        )
    )
    parts.append("<h2>Environment</h2>")
    parts.append(_table(["", "value"], [[html.escape(k), _fmt(v)] for k, v in info["env"].items()]))
    parts.append("<h2>Recipe</h2>")
    parts.append(f"<pre>{html.escape(yaml.safe_dump(info['recipe'], sort_keys=False))}</pre>")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>trainguard report</title>"
        f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>"
    )


def render_markdown(info: dict[str, Any]) -> str:
    lines = [f"# trainguard run report: {info['run_dir']}", ""]
    lines += ["| | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in _summary(info).items()]
    lines += ["", "## Findings", ""]
    if not info["findings"]:
        lines.append("No findings.")
    for f in info["findings"]:
        at = f" (step {f['step']})" if f.get("step") is not None else ""
        lines.append(f"- **{f['code']}** {f['severity']}{at}: {f['message']}")
    lines += ["", "## Checkpoints", ""]
    lines += [
        (f"- step {c['step']}: " if isinstance(c["step"], int) else f"- {c['step']}: ")
        + ("valid" if c["valid"] else f"INVALID ({c['problem']})")
        for c in info["checkpoints"]
    ]
    lines += ["", "Plots and the environment are in report.html.", ""]
    return "\n".join(lines)


def write_report(run_dir: str | Path) -> tuple[Path, Path]:
    run_dir = Path(run_dir)
    info = collect(run_dir)
    html_path, md_path = run_dir / "report.html", run_dir / "report.md"
    atomic_write_text(html_path, render_html(info))
    atomic_write_text(md_path, render_markdown(info))
    return html_path, md_path
