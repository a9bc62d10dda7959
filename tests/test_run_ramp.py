"""`trainguard run` with a batch-size ramp (`train.batch_ramp`): each step reads its size of
the data order, and a run killed after the change resumes from a checkpoint before it bitwise
like an uninterrupted run."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import yaml

from runhelpers import invoke_cli, run_cli
from test_run_resume import assert_bitwise_equal, final_weights, step_rows

# 4 sequences per step for steps 1-5, then the full batch of 8 (two micro-batches of 4).
RAMP = {"max_steps": 8, "batch_size": 4, "grad_accum": 2, "batch_ramp": [[0, 4], [5, 8]]}


def ramp_recipe(tiny_recipe: Path) -> Path:
    recipe = yaml.safe_load(tiny_recipe.read_text())
    recipe["train"].update(RAMP)
    tiny_recipe.write_text(yaml.safe_dump(recipe))
    return tiny_recipe


def test_a_ramped_run_killed_after_the_change_resumes_bitwise(
    tiny_recipe: Path, tmp_path: Path
) -> None:
    recipe = ramp_recipe(tiny_recipe)
    clean, chained = tmp_path / "clean", tmp_path / "chained"
    res = invoke_cli("run", str(recipe), "--run-dir", str(clean), "-q")
    assert res.returncode == 0, res.stderr
    rows = step_rows(clean)
    # Positions are the sum of the sizes before: five steps of 4, then steps of 8.
    assert [r["position"] for r in rows] == [0, 4, 8, 12, 16, 20, 28, 36]
    meta = json.loads((clean / "checkpoints" / "step-4" / "manifest.json").read_text())
    assert meta["meta"]["tokens_seen"] == 4 * 4 * 32  # four steps of 4 sequences of 32

    # Killed at step 6 (after the change at step 5; steps count from 0); checkpoint 4 is
    # before it.
    args = ["run", str(recipe), "--run-dir", str(chained), "-q"]
    killed = run_cli(*args, env={"TRAINGUARD_INJECT": "kill@6:backward"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    res = invoke_cli(*args)
    assert res.returncode == 0, res.stderr
    assert_bitwise_equal(final_weights(clean, 8), final_weights(chained, 8))
    again = step_rows(chained)
    assert [r["step"] for r in again] == list(range(8))
    assert [r["batch_hash"] for r in again] == [r["batch_hash"] for r in rows]
    assert [r["loss"] for r in again] == [r["loss"] for r in rows]


def test_a_ramp_that_does_not_reach_the_full_batch_is_refused(tiny_recipe: Path) -> None:
    recipe = ramp_recipe(tiny_recipe)
    res = invoke_cli(
        "run", str(recipe), "--run-dir", str(tiny_recipe.parent / "r"), "-q",
        "--set", "train.batch_ramp=[[0, 4], [5, 12]]",
    )  # fmt: skip
    assert res.returncode == 2
    assert "train.batch_ramp ends at 12 sequences" in res.stderr
    assert "end the ramp at 8" in res.stderr
    assert not (tiny_recipe.parent / "r").exists()


def test_the_ramp_counts_in_the_recipe_hash_only_when_set() -> None:
    import trainguard
    from trainguard.config.identity import curve_recipe, recipe_hash
    from trainguard.config.load import load_recipe, recipe_to_dict

    base = recipe_to_dict(load_recipe("default"))
    shipped = Path(trainguard.__file__).parent / "recipes" / "default.ref.json"
    # The shipped reference curve still names the default recipe: the new key is left out.
    assert recipe_hash(base) == json.loads(shipped.read_text())["recipe_hash"]
    assert "train.batch_ramp" not in curve_recipe(base)
    full = recipe_to_dict(load_recipe("default", ["train.grad_accum=2"]))
    ramp = ["train.grad_accum=2", "train.batch_ramp=[[0, 16], [5, 32]]"]
    assert recipe_hash(recipe_to_dict(load_recipe("default", ramp))) != recipe_hash(full)
