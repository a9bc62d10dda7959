"""`RUN_DIR/report.html` (self-contained, plots embedded) and `RUN_DIR/report.md`.

Everything comes from the run record in the run dir (run.json, metrics.jsonl, recipe.yaml for
`trainguard run`, the checkpoints it points at), so `trainguard report RUN_DIR` regenerates the
same report at any time, for any loop that wrote a record.
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

from trainguard.config.load import read_run_recipe
from trainguard.goodput.accounting import account
from trainguard.metrics.record_read import read_record
from trainguard.report import plots
from trainguard.report.checkpoints import list_checkpoints
from trainguard.report.decisions import batch_pages, decisions, page_href, page_name
from trainguard.report.episodes import finding_rows, skips_summary
from trainguard.util.atomic import atomic_paths

# Columns of "evals" rows that are bookkeeping, not metrics to plot.
_EVALS_BOOKKEEPING = {"kind", "step", "eval_seconds"}


def collect(run_dir: Path) -> dict[str, Any]:
    """What the report shows, from any run record (`metrics.record_read.read_record`): a
    `trainguard run`, your own loop's `Guard(run_dir=...)`, a GuardedTrainer, Lightning."""
    record = read_record(run_dir)
    rows = record.rows
    recipe = read_run_recipe(run_dir)
    # Plotted rows need a numeric step; a row without one is not trainguard's and is skipped.
    timed = [r for r in rows if isinstance(r.get("step"), int | float)]
    return {
        "run_dir": run_dir,
        "loop": record.loop,
        "recipe": recipe,
        "config": recipe or record.config,
        "steps": [r for r in timed if r.get("kind") == "step"],
        "evals": [r for r in timed if r.get("kind") == "eval"],
        "use_case": [r for r in timed if r.get("kind") == "evals"],
        "band": _band(recipe),
        "findings": [r for r in rows if r.get("kind") == "finding"],
        "events": record.events(),
        "env": record.environment,
        "checkpoints": list_checkpoints(record),
        "decisions": decisions([r for r in timed if r.get("kind") == "step"], run_dir),
        "skipped": record.skipped,  # metrics.jsonl lines no reader can use, "path:line: why"
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
        "recipe": info["recipe"].get("name", "?") if info["recipe"] else info["loop"],
        "steps": last.get("step", -1) + 1,  # steps count from 0: the last one's index + 1
        "final train loss": last.get("loss"),
        "final val loss": evals[-1].get("val_loss") if evals else None,
        "final val bits/byte": evals[-1].get("val_bpb") if evals else None,
        "median tokens/s": tps[len(tps) // 2] if tps else None,
        "findings": len(info["findings"]),
        "checkpoints": len(info["checkpoints"]),
        **skips_summary(steps, info["loop"]),
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
            loop=info["loop"],
            summary=list(_summary(info).items()),
            training_plots=training_plots,
            use_case=_use_case(info),
            goodput=_goodput(info),
            prediction_plot=_data_uri(plots.prediction_plot(info["band"], evals))
            if info["band"]
            else None,
            findings=findings,
            decisions=[d | {"href": page_href(info, d["step"])} for d in info["decisions"]],
            skipped=info["skipped"],
            checkpoints=checkpoints,
            env=list(info["env"].items()) if isinstance(info["env"], dict) else [],
            recipe_yaml=yaml.safe_dump(info["config"], sort_keys=False),
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
    if info["decisions"]:
        lines += ["", "## Decisions", ""]
        lines += [
            f"- step {_md(d['step'])}: {_md(d['action'])} (batch: {_md_code(d['batch'])})"
            for d in info["decisions"]
        ]
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
        + ("verified" if c["valid"] else f"{_md(c['status'])} ({_md(c['problem'])})")
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
    pages = batch_pages(info, render_batch_html)  # each decision's batch view, linked
    info["batch_pages"] = set(pages)
    html, markdown = render_html(info), render_markdown(info)
    page_paths = [run_dir / page_name(step) for step in pages]
    if pages:
        (run_dir / page_name(0)).parent.mkdir(exist_ok=True)
    with atomic_paths(html_path, md_path, *page_paths) as (html_tmp, md_tmp, *page_tmps):
        html_tmp.write_text(html, encoding="utf-8")
        md_tmp.write_text(markdown, encoding="utf-8")
        for tmp, text in zip(page_tmps, pages.values(), strict=True):
            tmp.write_text(text, encoding="utf-8")
    return html_path, md_path


def render_batch_html(view: Any, run_dir: str | Path) -> str:
    """`trainguard batch --html`: a `report.batch.BatchView` as a page (values escaped)."""
    return _environment().get_template("batch.html.j2").render(view=view, run_dir=str(run_dir))
