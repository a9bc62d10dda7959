"""Evaluation first in `trainguard run`: refusal without a use-case eval, eval rows in the log,
and the off-track alarm against a scaling-law band."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from runhelpers import invoke_cli


def rows(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def test_run_refuses_recipe_without_use_case_eval(tiny_recipe: Path, tmp_path: Path) -> None:
    recipe = yaml.safe_load(tiny_recipe.read_text())
    recipe["evals"] = {"specs": []}
    path = tmp_path / "noevals.yaml"
    path.write_text(yaml.safe_dump(recipe))
    res = invoke_cli("run", str(path), "--run-dir", str(tmp_path / "a"), "-q")
    assert res.returncode == 2
    assert "E101" in res.stderr and "--no-evals" in res.stderr
    res = invoke_cli(
        "run",
        str(path),
        "--run-dir",
        str(tmp_path / "b"),
        "-q",
        "--no-evals",
        "--set",
        "train.max_steps=2",
    )
    assert res.returncode == 0, res.stderr
    assert rows(tmp_path / "b", "evals") == []


def test_evals_run_before_during_and_after(finished_tiny_run: Path) -> None:
    steps = [r["step"] for r in rows(finished_tiny_run, "evals")]
    assert steps == [0, 6, 12]  # baseline, every eval_interval, the end
    assert all("python_next_line/acc" in r for r in rows(finished_tiny_run, "evals"))


def run_with_band(recipe: Path, tmp_path: Path, loss: float, low: float, high: float, *sets):
    """A tiny run whose prediction band is flat at (low, loss, high); returns its payload."""
    band = {
        "params": 1e5,
        "tokens": [500.0, 3072.0],
        "loss": [loss] * 2,
        "low": [low] * 2,
        "high": [high] * 2,
    }
    band_path = tmp_path / "band.json"
    band_path.write_text(json.dumps(band))
    res = invoke_cli(
        "run",
        str(recipe),
        "--run-dir",
        str(tmp_path / "r"),
        "-q",
        "--json",
        "--set",
        f"prediction.band={band_path}",
        *sets,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_off_track_alarm_fires_when_loss_leaves_the_band(tiny_recipe: Path, tmp_path: Path) -> None:
    payload = run_with_band(tiny_recipe, tmp_path, 1.0, 0.9, 1.1, "--set", "prediction.patience=1")
    codes = [f["code"] for f in payload["findings"]]
    assert codes.count("E151") == 1  # above the band, reported once per excursion
    html = (tmp_path / "r" / "report.html").read_text()
    assert "Scaling-law prediction" in html


def test_no_off_track_alarm_inside_a_generous_band(tiny_recipe: Path, tmp_path: Path) -> None:
    payload = run_with_band(tiny_recipe, tmp_path, 6.0, 4.0, 9.0, "--set", "train.max_steps=6")
    codes = [f["code"] for f in payload["findings"]]
    assert not {"E151", "E152"} & set(codes)
