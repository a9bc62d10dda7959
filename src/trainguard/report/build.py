"""`RUN_DIR/report.html` (self-contained, plots embedded) and `RUN_DIR/report.md`.

Everything comes from files in the run dir (metrics.jsonl, recipe.yaml, checkpoints), so
`trainguard report RUN_DIR` regenerates the same report at any time.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import re
from pathlib import Path
from typing import Any

import jinja2
import yaml

from trainguard.checkpoint.folder import inspect_local_folder
from trainguard.checkpoint.local import scan_root
from trainguard.checkpoint.manifest import step_dirname
from trainguard.checkpoint.target import run_checkpoint_root
from trainguard.config.load import read_run_recipe
from trainguard.errors import BadInputError
from trainguard.goodput.accounting import account
from trainguard.metrics.jsonl import METRICS_FILE, read_metrics
from trainguard.report import plots
from trainguard.report.episodes import finding_rows, skips_summary
from trainguard.util.atomic import atomic_paths
from trainguard.util.paths import is_remote, local_path

# Columns of "evals" rows that are bookkeeping, not metrics to plot.
_EVALS_BOOKKEEPING = {"kind", "step", "eval_seconds"}


def _checkpoints(run_dir: Path) -> list[dict[str, Any]]:
    """Every entry of a local checkpoint root: step folders verified in full (checksums
    included), anything else listed as ignored (C110). Never raises on what is in there."""
    root = run_checkpoint_root(run_dir)
    if is_remote(root):
        return []  # an object store: listing it is `trainguard eval`'s job, not the report's
    root_path = local_path(root)
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
    skipped: list[str] = []
    rows = read_metrics(run_dir, skipped)
    recipe = read_run_recipe(run_dir)
    events = [r for r in rows if r.get("kind") == "event"]
    env = next((e.get("env") for e in events if e.get("event") == "start"), {}) or {}
    # Plotted rows need a numeric step; a row without one is not trainguard's and is skipped.
    timed = [r for r in rows if isinstance(r.get("step"), int | float)]
    return {
        "run_dir": run_dir,
        "recipe": recipe,
        "steps": [r for r in timed if r.get("kind") == "step"],
        "evals": [r for r in timed if r.get("kind") == "eval"],
        "use_case": [r for r in timed if r.get("kind") == "evals"],
        "band": _band(recipe),
        "findings": [r for r in rows if r.get("kind") == "finding"],
        "events": events,
        "env": env,
        "checkpoints": _checkpoints(run_dir),
        "skipped": skipped,  # metrics.jsonl lines no reader can use, "path:line: why"
        "goodput": account(rows).to_dict(),
    }


def _band(recipe: dict[str, Any]) -> dict[str, Any] | None:
    path = (recipe.get("prediction") or {}).get("band")
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # no band drawn from a damaged file
        return None


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _summary(info: dict[str, Any]) -> dict[str, Any]:
    steps, evals = info["steps"], info["evals"]
    last = steps[-1] if steps else {}
    tps = sorted(r["tokens_per_s"] for r in steps if isinstance(r.get("tokens_per_s"), float))
    return {
        "recipe": info["recipe"].get("name", "?"),
        "steps": last.get("step", 0),
        "final train loss": last.get("loss"),
        "final val loss": evals[-1].get("val_loss") if evals else None,
        "final val bits/byte": evals[-1].get("val_bpb") if evals else None,
        "median tokens/s": tps[len(tps) // 2] if tps else None,
        "findings": len(info["findings"]),
        "checkpoints": len(info["checkpoints"]),
        **skips_summary(steps),
    }


def _fmt(v: Any) -> str:
    """Plain text of a value (floats to 4 places); escaping is the template's job."""
    return f"{v:.4f}" if isinstance(v, float) else str(v)


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("trainguard.report", "templates"),
        autoescape=True,  # every value is escaped unless a template says otherwise (none does)
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["fmt"] = _fmt
    return env


def _use_case(info: dict[str, Any]) -> dict[str, Any] | None:
    use_case = info["use_case"]
    # Plot the scores; "/n" columns are example counts.
    keys = sorted(
        {k for e in use_case for k, v in e.items() if isinstance(v, float) and not k.endswith("/n")}
        - _EVALS_BOOKKEEPING
    )
    if not keys:
        return None
    last = use_case[-1]
    return {
        "plot": _data_uri(plots.eval_metrics_plot(use_case, keys)),
        "step": last.get("step"),
        "rows": [(k, last.get(k)) for k in keys],
    }


def _goodput(info: dict[str, Any]) -> dict[str, Any] | None:
    """The goodput bar and its shares (docs/goodput.md), None for a log without timed steps."""
    g = info.get("goodput")
    if not g or not g["wall_s"]:
        return None
    shares = [(k, f"{v:.1%}", f"{g['seconds'][k]:.2f}") for k, v in g["shares"].items()]
    return {"plot": _data_uri(plots.goodput_plot(g)), "shares": shares, "goodput": g["goodput"]}


def render_html(info: dict[str, Any]) -> str:
    steps, evals = info["steps"], info["evals"]
    training_plots = []
    if steps:
        marks = info["findings"]  # drawn at their steps by plots.py
        grad = plots.series_plot(steps, "grad_norm", "Gradient norm", "norm", marks)
        tps = plots.series_plot(steps, "tokens_per_s", "Throughput", "tokens/s", marks)
        training_plots = [
            ("loss", _data_uri(plots.loss_plot(steps, evals, marks))),
            ("grad", _data_uri(grad)),
            ("throughput", _data_uri(tps)),
            *((alt, _data_uri(png)) for alt, png in plots.health_plots(steps, marks)),
        ]
    findings = finding_rows(info)
    checkpoints = [
        {**c, "megabytes": f"{c['bytes'] / 1e6:.1f}" if isinstance(c["bytes"], int) else "?"}
        for c in info["checkpoints"]
    ]
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            run_dir=str(info["run_dir"]),
            summary=list(_summary(info).items()),
            training_plots=training_plots,
            use_case=_use_case(info),
            goodput=_goodput(info),
            prediction_plot=_data_uri(plots.prediction_plot(info["band"], evals))
            if info["band"]
            else None,
            findings=findings,
            skipped=info["skipped"],
            checkpoints=checkpoints,
            env=list(info["env"].items()) if isinstance(info["env"], dict) else [],
            recipe_yaml=yaml.safe_dump(info["recipe"], sort_keys=False),
        )
    )


# Characters with a meaning inside a Markdown line (CommonMark, GitHub's tables and
# strikethrough): each is backslash-escaped; <, > and & become entities, so no value is ever
# read as HTML. (Line-start markers such as # and + cannot occur: every value follows text.)
_MD_SPECIAL = re.compile(r"([\\`*_\[\]!|~])")


def _md(v: Any) -> str:
    """A value as inert Markdown text, on one line (the report.html escaping, for report.md):
    a recipe name or finding message holding HTML, links or table pipes shows as typed."""
    text = " ".join(_fmt(v).splitlines())
    text = html.escape(text, quote=False)
    return _MD_SPECIAL.sub(r"\\\1", text)


def _md_code(text: str) -> str:
    """`text` as an inline code span (nothing inside is markup), fenced with more backticks
    than any run of them inside it."""
    text = " ".join(text.splitlines())
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def render_markdown(info: dict[str, Any]) -> str:
    lines = [f"# trainguard run report: {_md(info['run_dir'])}", ""]
    lines += ["| | value |", "|---|---|"]
    lines += [f"| {_md(k)} | {_md(v)} |" for k, v in _summary(info).items()]
    lines += ["", "## Findings", ""]
    if not info["findings"]:
        lines.append("No findings.")
    for f in finding_rows(info):
        at = "" if f["step"] in (None, "") else f" (step {_md(f['step'])})"
        if f["count"] > 1:
            at = f" (steps {_md(f['step'])}, {f['count']} findings)"
        batch = f" (batch: {_md_code(f['batch'])})" if f["batch"] else ""
        lines.append(f"- **{_md(f['code'])}** {_md(f['severity'])}{at}: {_md(f['message'])}{batch}")
    if info["skipped"]:
        lines += ["", "## Log lines skipped", ""]
        lines += [f"- {_md(line)}" for line in info["skipped"]]
    g = info.get("goodput")
    if g and g["wall_s"]:
        lines += ["", "## Goodput", "", "| | share | seconds |", "|---|---|---|"]
        lines += [f"| {k} | {v:.1%} | {g['seconds'][k]:.2f} |" for k, v in g["shares"].items()]
    lines += ["", "## Checkpoints", ""]
    lines += [
        f"- {'step ' if isinstance(c['step'], int) else ''}{_md(c['step'])}: "
        + ("valid" if c["valid"] else f"INVALID ({_md(c['problem'])})")
        for c in info["checkpoints"]
    ]
    lines += ["", "Plots and the environment are in report.html.", ""]
    return "\n".join(lines)


def write_report(run_dir: str | Path, skipped: list[str] | None = None) -> tuple[Path, Path]:
    """Write report.html and report.md; `skipped`, when given, receives the metrics.jsonl
    lines left out ("path:line: why"), for the command to warn about."""
    run_dir = Path(run_dir)
    info = collect(run_dir)
    if skipped is not None:
        skipped.extend(info["skipped"])
    html_path, md_path = run_dir / "report.html", run_dir / "report.md"
    html, markdown = render_html(info), render_markdown(info)
    with atomic_paths(html_path, md_path) as (html_tmp, md_tmp):
        html_tmp.write_text(html, encoding="utf-8")
        md_tmp.write_text(markdown, encoding="utf-8")
    return html_path, md_path


def render_batch_html(view: Any, run_dir: str | Path) -> str:
    """`trainguard batch --html`: a `report.batch.BatchView` as a page (values escaped)."""
    return _environment().get_template("batch.html.j2").render(view=view, run_dir=str(run_dir))
