"""The HTML report in a real headless browser (issue 22 item 4): the page loads without a
script or resource error, every curve decodes to a real picture, and the sections a person
looks for are there. The checker itself is shown failing on a broken page first."""

from __future__ import annotations

from pathlib import Path

import pytest

from browser import browser_available, load_page
from trainguard.report.build import write_report

pytestmark = pytest.mark.skipif(
    not browser_available(), reason="no headless Chromium (make setup-dev installs it)"
)


def test_the_checker_sees_a_script_error_and_a_broken_picture(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text(
        "<!doctype html><title>t</title><h1>x</h1>"
        "<img alt='curve' src='data:image/png;base64,iVBORw0KGgo='>"
        "<script>undefinedFunction()</script>"
    )
    seen = load_page(page)
    assert any("undefinedFunction" in e for e in seen.errors)
    assert seen.images == [
        {"alt": "curve", "complete": True, "naturalWidth": 0, "naturalHeight": 0}
    ]


def test_the_run_report_renders_in_a_browser(tiny_run_copy: Path) -> None:
    html, _md = write_report(tiny_run_copy)
    page = load_page(html)
    assert page.errors == []
    assert page.title == "trainguard report"
    for section in ("Training", "Findings", "Checkpoints", "Environment", "Recipe"):
        assert section in page.headings
    curves = [i for i in page.images if i["alt"] != "evals"]
    assert curves, "the report shows no training curve"
    for image in page.images:  # every picture decoded to real pixels
        assert image["complete"] and image["naturalWidth"] > 100, image
    assert "step" in page.text
