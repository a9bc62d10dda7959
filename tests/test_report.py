"""report.html treats everything it shows as data: values from metrics.jsonl and the recipe
are escaped (a run dir may come from someone else, and the report is opened in a browser)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import yaml

from trainguard.report.build import write_report

PAYLOAD = "<script>alert({})</script>"
IMG = '<img src=x onerror="alert({})">'

# The tags the report itself writes; anything else came from the data.
REPORT_TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "table", "tr", "th", "td",
    "span", "img", "p", "pre",
}  # fmt: skip


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def _hostile_run(run_dir: Path) -> None:
    """A run dir whose every free-text field is markup."""
    run_dir.mkdir()
    rows = [
        {"kind": "event", "event": "start", "env": {IMG.format(1): PAYLOAD.format(2)}},
        *(
            {"kind": "step", "step": s, "loss": 3.0 - s / 10, "grad_norm": 1.0, "tokens_per_s": 9.5}
            for s in range(1, 5)
        ),
        {"kind": "eval", "step": 4, "val_loss": 2.5, "val_bpb": 1.1},
        {"kind": "evals", "step": 4, PAYLOAD.format(3): 0.25, PAYLOAD.format(4) + "/acc": 0.5},
        {
            "kind": "finding",
            "code": IMG.format(5),
            "severity": 'error"><script>alert(6)</script><span class="',
            "message": "</td></tr></table>" + PAYLOAD.format(7),
            "fix": PAYLOAD.format(8),
            "step": PAYLOAD.format(9),
        },
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {"name": PAYLOAD.format(10), "description": IMG.format(11)}
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe))


def test_every_value_from_the_run_dir_is_escaped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _hostile_run(run_dir)
    html_path, _ = write_report(run_dir)
    page = html_path.read_text(encoding="utf-8")
    parser = _Tags()
    parser.feed(page)
    tags = {t for t, _ in parser.tags}
    assert tags <= REPORT_TAGS, f"markup from the data became tags: {tags - REPORT_TAGS}"
    for tag, attrs in parser.tags:
        assert not [a for a, _ in attrs if a.startswith("on")], (tag, attrs)
        if tag == "img":
            assert dict(attrs)["src"].startswith("data:image/png;base64,"), attrs
        if tag == "span":  # the severity's class is one of the report's own
            assert dict(attrs)["class"] in {"sev-error", "sev-warning", "sev-info", "sev-other"}
    # Every payload is shown, as text: severity, metric name, message, fix, step, env, recipe.
    for n in range(1, 12):
        shown = PAYLOAD.format(n) if n not in (1, 5, 11) else IMG.format(n)
        escaped = shown.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        escaped = escaped.replace('"', "&#34;")
        assert escaped in page, f"payload {n} is missing or not escaped"


def test_rows_without_a_numeric_step_are_skipped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _hostile_run(run_dir)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "step", "step": "<b>7</b>", "loss": 1.0}) + "\n")
        f.write(json.dumps({"kind": "evals", "step": None, "x": 0.5}) + "\n")
        f.write("[1, 2]\n")  # JSON, but not a row
    html_path, md_path = write_report(run_dir)
    assert "&lt;b&gt;7&lt;/b&gt;" not in html_path.read_text() and md_path.is_file()
