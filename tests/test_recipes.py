"""The tested recipe library: every shipped recipe trains at its CI settings (a few seconds on
CPU) and matches its shipped CI reference curve, bitwise where the environment is the
reference's. `pytest tests/test_recipes.py --record-references` rewrites the CI references
(after a deliberate change of numerics; the diff shows what moved)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runhelpers import invoke_cli
from trainguard.config.load import load_recipe
from trainguard.reference.catalog import CATALOG, ci_settings, reference_path
from trainguard.reference.record import record_reference
from trainguard.train.guarded_run import run_recipe

REFERENCE_CODES = ("R501", "R502", "R503", "R504", "R505")


def ci_recipe(name: str, corpus: Path, cache: Path, *extra: str):
    # data.source and data.cache_dir are operational: the recipe hash stays the shipped one.
    return load_recipe(
        name, [*ci_settings(name), f"data.source={corpus}", f"data.cache_dir={cache}", *extra]
    )


def reference_event(run_dir: Path) -> dict | None:
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "event" and row.get("event") == "reference":
            return row
    return None


@pytest.mark.parametrize("name", list(CATALOG))
def test_recipe_matches_its_reference(
    name: str, small_corpus: Path, cache_dir: Path, tmp_path: Path, request, torch_globals
) -> None:
    recipe = ci_recipe(name, small_corpus, cache_dir)
    run_dir = tmp_path / "run"
    result = run_recipe(recipe, run_dir, progress=False, report=False, evals=False)
    assert result.final_step == recipe.train.max_steps
    if request.config.getoption("--record-references"):
        curve, not_clean = record_reference(run_dir)
        assert not not_clean, not_clean
        curve.save(reference_path(name, ci=True))
        return
    event = reference_event(run_dir)
    assert event is not None, (
        f"no shipped reference matched {name} at CI settings: the recipe changed since "
        f"{reference_path(name, ci=True).name} was recorded; rerun with --record-references"
    )
    assert event["origin"] == f"the shipped reference {name}.ci.ref.json"
    departures = [f for f in result.findings if f.code in REFERENCE_CODES]
    assert not departures, [str(f) for f in departures]
    summary = next(f for f in result.findings if f.code == "R506").data
    assert summary["compared"] == recipe.train.max_steps
    if event["bitwise_expected"]:  # this machine's software, CPU and threads: the same bits
        assert summary["bitwise_equal"], summary


def test_recipes_command_lists_the_library() -> None:
    res = invoke_cli("recipes", "--json")
    assert res.returncode == 0, res.stderr
    entries = {e["name"]: e for e in json.loads(res.stdout)["recipes"]}
    assert set(CATALOG) <= set(entries)
    for name in CATALOG:
        ci = next(r for r in entries[name]["references"] if r["settings"] == "CI (tiny)")
        assert ci["status"] == "current", (name, ci)
        # A shipped full-size reference must belong to the recipe as shipped (not stale).
        full = next(r for r in entries[name]["references"] if r["settings"] == "shipped")
        assert full["status"] in ("current", "pending", "pending a GPU run"), (name, full)
        assert "tests/test_recipes.py" in entries[name]["tested"]["ci"]
    gpu = next(r for r in entries["gpt-small-gpu"]["references"] if r["settings"] == "shipped")
    assert gpu["status"] == "pending a GPU run"
    assert entries["gpt-small-gpu"]["tested"]["full"].startswith("reference pending a GPU run")
