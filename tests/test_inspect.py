"""`trainguard data inspect`: per-rule counts, reproducible samples, highlighted spans."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from test_filters import CLEAN, PLANTED
from trainguard.cli import app
from trainguard.filters.inspection import inspect_source
from trainguard.filters.render import render_html, segments

runner = CliRunner()


def _source(tmp_path, n_clean=30):
    docs = [{"id": f"c{i}", "text": CLEAN} for i in range(n_clean)]
    docs += [{"id": code, "text": text} for code, text in sorted(PLANTED.items())]
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return src, docs


def test_counts_cover_the_whole_source_and_samples_are_reproducible(tmp_path):
    src, docs = _source(tmp_path)
    insp = inspect_source(src, n=5, seed=3)
    assert insp.total == len(docs)
    assert insp.flagged == len(PLANTED)
    assert insp.by_code == {code: 1 for code in PLANTED}
    assert len(insp.samples) == 5
    again = inspect_source(src, n=5, seed=3)
    assert [s.record.id for s in again.samples] == [s.record.id for s in insp.samples]
    draws = {tuple(s.record.id for s in inspect_source(src, n=5, seed=k).samples) for k in range(6)}
    assert len(draws) > 1  # the seed changes the draw
    flagged = inspect_source(src, n=50, seed=0, only_flagged=True)
    assert sorted(s.record.id for s in flagged.samples) == sorted(PLANTED)


def test_segments_cut_at_every_flag():
    text = PLANTED["D240"]
    from trainguard.filters import apply_rules

    flags = apply_rules(text)
    pieces = list(segments(text, flags))
    assert "".join(p for p, _ in pieces) == text
    assert [p for p, cover in pieces if cover] == ["Table 3", "Fig. 4"]


def test_html_page_highlights_spans(tmp_path):
    src, _ = _source(tmp_path, n_clean=0)
    insp = inspect_source(src, n=50)
    page = render_html(insp, str(src))
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page
    assert 'title="D240: mentions Table 3' in page and ">Table 3</mark>" in page
    assert "&lt;xDC&gt;" not in page and "&lt;xE9&gt;" in page  # invalid byte made visible
    assert "&lt;U+202E&gt;" in page  # the bidi override is shown, not applied


def test_cli_terminal_json_and_html(tmp_path):
    src, docs = _source(tmp_path)
    out = tmp_path / "page" / "inspect.html"
    res = runner.invoke(
        app, ["data", "inspect", str(src), "--n", "4", "--seed", "1", "--html", str(out), "--json"]
    )
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["ok"] is True and payload["findings"] == []
    assert payload["total"] == len(docs) and payload["flagged"] == len(PLANTED)
    assert len(payload["samples"]) == 4
    assert out.read_text().count("<section>") == 4
    res = runner.invoke(app, ["data", "inspect", str(src), "--n", "3", "--only-flagged"])
    assert res.exit_code == 0, res.output
    assert "rule counts over" in res.stdout and "D240" in res.stdout


def test_folder_source_with_invalid_bytes(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "good.txt").write_text(CLEAN)
    (folder / "latin1.txt").write_bytes(CLEAN.encode() + b" caf\xe9")
    insp = inspect_source(folder, n=5)
    assert insp.by_code == {"D230": 1}
    bad = next(s for s in insp.samples if s.record.id == "latin1.txt")
    assert [bad.record.text[f.start : f.end] for f in bad.flags] == ["\udce9"]
