"""Evals and gating runs on real trainguard runs (the tiny recipe of conftest.py)."""

from __future__ import annotations

import json

from runhelpers import invoke_cli
from trainguard.evals.lint import lint_spec
from trainguard.evals.load import load_model_for_eval


def test_eval_on_a_real_run_and_builtin_lints_clean(finished_tiny_run):
    res = invoke_cli("eval", str(finished_tiny_run), "--max-examples", "20", "--json")
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
    """Two real guarded runs (run_recipe) of different sizes, rows appended to the CSV."""
    from trainguard.scaling.grid import parse_grid, read_runs_csv, run_grid
    from trainguard.train.guarded_run import run_recipe

    def runner(recipe, run_dir):
        return run_recipe(recipe, run_dir, progress=False)

    out = tmp_path / "scale"
    axes = parse_grid(["model.d_model=16,32"])
    kw = {"runner": runner, "overrides": ["train.max_steps=4"]}
    rows, findings = run_grid(str(tiny_recipe), axes, out, out / "runs.csv", **kw)
    assert findings == [] and len(rows) == 2
    n, d, loss = read_runs_csv(out / "runs.csv")
    assert n[0] < n[1] and d[0] == d[1] > 0 and (loss > 0).all()
    assert all((out / r["name"] / "metrics.jsonl").is_file() for r in rows)
    # Rerunning skips the finished cells.
    again, _ = run_grid(str(tiny_recipe), axes, out, out / "runs.csv", **kw)
    assert again == []
