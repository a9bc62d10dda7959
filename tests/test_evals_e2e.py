"""Evals and gating runs on real trainguard runs (the tiny recipe of conftest.py)."""

from __future__ import annotations

import csv
import json

from runhelpers import run_cli
from trainguard.evals.lint import lint_spec
from trainguard.evals.load import load_model_for_eval


def test_eval_on_a_real_run_and_builtin_lints_clean(finished_tiny_run):
    res = run_cli("eval", str(finished_tiny_run), "--max-examples", "20", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["metrics"]["python_next_line/n"] == 20
    assert 0.0 <= out["metrics"]["python_next_line/acc"] <= 1.0
    assert out["checkpoint"].endswith("step-12")
    # The shipped use-case eval, built from this run's validation split, passes the lint
    # with this run's tokenizer: no trailing-space trap, no boundary mismatch, BOS once.
    _, tok, recipe = load_model_for_eval(finished_tiny_run)
    assert lint_spec("python_next_line", tok, data=recipe.data, max_examples=60) == []


def test_scale_run_real_grid(tiny_recipe, tmp_path):
    out = tmp_path / "scale"
    res = run_cli(
        "scale",
        "run",
        str(tiny_recipe),
        "--grid",
        "model.d_model=16,32",
        "--set",
        "train.max_steps=4",
        "--out",
        str(out),
        "--json",
        timeout=900,
    )
    assert res.returncode == 0, res.stderr
    with open(out / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    assert len({r["params"] for r in rows}) == 2 and all(int(r["tokens"]) > 0 for r in rows)
    assert all(float(r["loss"]) > 0 for r in rows)
    # Rerunning skips the finished cells.
    again = run_cli(
        "scale",
        "run",
        str(tiny_recipe),
        "--grid",
        "model.d_model=16,32",
        "--set",
        "train.max_steps=4",
        "--out",
        str(out),
        "--json",
    )
    assert again.returncode == 0 and json.loads(again.stdout)["rows"] == []
