"""Values are never taken without a word (issue 26, item 4 and the API part of item 9).

Recipes: strict types (no boolean is a step count or a learning rate, no float a count, no 1 a
boolean), while `--set train.lr=3e-4` and `train.max_steps=300` keep working; an empty recipe is
refused. The public API refuses wrong types at its boundary with a `ConfigError` naming the
argument: `ElasticSampler`, `Guard`, the eval runner's `max_examples` and gold indices,
`fit_scaling_law`'s bootstrap count. The CLI cases are rows of tests/test_bad_input_matrix.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError

from trainguard import ElasticSampler
from trainguard.config.load import load_recipe
from trainguard.errors import ConfigError
from trainguard.evals.spec import EvalSpecError, load_spec, task_rows
from trainguard.guard.config import GuardsConfig
from trainguard.guard.core import Guard


# -- recipes -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, key",
    [
        ("train.max_steps=true", "train.max_steps"),  # trained 1 step
        ("train.lr=true", "train.lr"),  # trained at lr 1.0
        ("train.max_steps=8.0", "train.max_steps"),
        ("distributed.straggler_threshold=true", "distributed.straggler_threshold"),
        ("guards.divergence_patience=true", "guards.divergence_patience"),
        ("evals.max_examples=true", "evals.max_examples"),
        ("checkpoint.async_save=1", "checkpoint.async_save"),
    ],
)
def test_override_of_the_wrong_type_is_refused_naming_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_recipe("default", [override])


def test_overrides_as_yaml_writes_them_keep_working() -> None:
    r = load_recipe(
        "default",
        ["train.lr=3e-4", "train.max_steps=300", "guards.oscillation_alpha=1e-5", "train.lr=1"],
    )
    assert (r.train.lr, r.train.max_steps, r.guards.oscillation_alpha) == (1.0, 300, 1e-5)
    assert load_recipe("default", ["train.lr=3e-4"]).train.lr == 3e-4  # YAML 1.1: a string


def test_config_sections_refuse_booleans_for_numbers() -> None:
    with pytest.raises(ValidationError):
        GuardsConfig(divergence_patience=True)
    with pytest.raises(ValidationError):
        GuardsConfig(hang_floor_s=True)


def test_empty_recipe_is_refused_and_braces_mean_the_defaults(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_bytes(b"")
    with pytest.raises(ConfigError, match="is empty"):
        load_recipe(str(empty))
    comments = tmp_path / "comments.yaml"
    comments.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_recipe(str(comments))
    braces = tmp_path / "braces.yaml"
    braces.write_text("{}\n")
    assert load_recipe(str(braces)).name == "default"


# -- ElasticSampler --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, kw, name",
    [
        (("100",), {"global_batch_size": 4, "seed": 0}, "num_samples"),
        ((100,), {"global_batch_size": 4, "seed": None}, "seed"),
        ((100,), {"global_batch_size": 8.5, "seed": 0}, "global_batch_size"),
        ((100,), {"global_batch_size": True, "seed": 0}, "global_batch_size"),
        ((100,), {"global_batch_size": 4, "seed": 0, "micro_batch_size": 1.5}, "micro_batch_size"),
        ((100,), {"global_batch_size": 4, "seed": 0, "max_steps": "10"}, "max_steps"),
        ((100,), {"global_batch_size": 4, "seed": -1}, "seed"),
    ],
)
def test_sampler_refuses_wrong_types_naming_the_argument(args, kw, name) -> None:
    with pytest.raises(ConfigError, match=name):
        ElasticSampler(*args, **kw)


def test_sampler_steps_are_whole_numbers_it_can_address() -> None:
    s = ElasticSampler(100, global_batch_size=4, seed=0)
    with pytest.raises(ConfigError, match="step must be an integer, got float 1.7"):
        s.batch_ids(1.7)  # was truncated to step 1
    with pytest.raises(ConfigError, match="step"):
        s.set_step(2.5)
    with pytest.raises(ConfigError, match="step"):
        s.skip([1.5])  # was the block of step 1
    assert s.skipped_positions == []
    with pytest.raises(ConfigError, match="past the last step"):
        s.batch_ids(2**63)  # was an OverflowError from numpy
    assert s.batch_ids(2**60).shape == (4,)  # far, but addressable


def test_sampler_state_with_negative_or_fractional_positions_is_refused() -> None:
    s = ElasticSampler(100, global_batch_size=4, seed=0)
    before = [s.batch_ids(k).tolist() for k in range(3)]
    for ranges in ([[-8, -4]], [[4.5, 8.5]], [[True, 5]]):
        state = {**s.state_dict(), "skipped_positions": ranges}
        with pytest.raises(ConfigError, match="skipped position"):
            s.load_state_dict(state)
    assert [s.batch_ids(k).tolist() for k in range(3)] == before  # no batch shifted
    with pytest.raises(ConfigError, match="state"):
        s.load_state_dict(None)


# -- Guard -----------------------------------------------------------------------------------------
def test_guard_takes_a_dict_config_validated_or_refuses_it_naming_config() -> None:
    g = Guard(config={"spike_window": 16, "max_rollbacks": 0})
    assert isinstance(g.config, GuardsConfig) and g.config.spike_window == 16
    with pytest.raises(ConfigError, match=r"config.*spike_window"):
        Guard(config={"spike_window": "many"})
    with pytest.raises(ConfigError, match=r"config.*unknown_key"):
        Guard(config={"unknown_key": 1})
    with pytest.raises(ConfigError, match="config"):
        Guard(config=5)
    with pytest.raises(ConfigError, match="actions"):
        Guard(actions=["R102"])


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"loss": "abc"}, "loss"),
        ({"loss": torch.ones(3)}, "loss"),
        ({"loss": True}, "loss"),
        ({"loss": 2.0, "grad_norm": torch.ones(2, 2)}, "grad_norm"),
        ({"loss": 2.0, "my_metric": object()}, "my_metric"),
    ],
)
def test_guard_step_refuses_a_metric_that_is_no_number_naming_it(kw, name) -> None:
    g = Guard()
    with pytest.raises(ConfigError, match=name):
        g.step(0, **kw)
    with pytest.raises(ConfigError, match=name):
        g.step_async(0, **kw)
    assert g.history == [] and g.state_dict()["monitors"] == Guard().state_dict()["monitors"]


def test_guard_step_still_takes_scalars_and_one_element_tensors() -> None:
    g = Guard()
    assert g.step(0, loss=torch.tensor(2.0), grad_norm=torch.ones(1, 1)).action == "apply"
    assert g.step(1, loss=2.0, grad_norm=1).action == "apply"


def test_guard_load_state_dict_refuses_what_is_no_state_and_changes_nothing() -> None:
    g = Guard()
    for s in range(30):
        g.step(s, loss=3.0 - s / 100, grad_norm=1.0)
    g.rollbacks = 2
    before = json.dumps(g.state_dict(), sort_keys=True, default=str)
    with pytest.raises(ConfigError, match="state"):
        g.load_state_dict(None)
    with pytest.raises(ConfigError, match="state"):
        g.load_state_dict({"monitors": {}, "rollbacks": "two"})
    assert json.dumps(g.state_dict(), sort_keys=True, default=str) == before


# -- evals -----------------------------------------------------------------------------------------
def _mc_spec(tmp_path: Path, row: dict) -> Path:
    (tmp_path / "mc.jsonl").write_text(json.dumps({"context": "2+2=", **row}) + "\n")
    spec = {"name": "mc", "tasks": [{"name": "t", "type": "multiple_choice", "data": "mc.jsonl"}]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("gold", [7, -1])
def test_run_evals_refuses_a_gold_index_out_of_range_before_scoring(tmp_path, gold) -> None:
    from trainguard.evals.runner import run_evals

    spec = _mc_spec(tmp_path, {"choices": ["4", "5"], "gold": gold})
    with pytest.raises(EvalSpecError, match=f"E117.*gold={gold} with 2 choices"):
        run_evals(torch.nn.Linear(1, 1), None, [str(spec)])


@pytest.mark.parametrize(
    "row, words",
    [
        ({"choices": ["b", 5], "gold": 0}, "strings"),
        ({"choices": [], "gold": 0}, "empty"),
        ({"choices": ["4", "5"], "gold": False}, "'gold' of type int"),
    ],
)
def test_multiple_choice_rows_the_scorer_cannot_use_are_bad_input(tmp_path, row, words) -> None:
    from trainguard.evals.lint import lint_spec

    spec = _mc_spec(tmp_path, row)
    with pytest.raises(EvalSpecError, match=f"line 1.*{words}"):
        lint_spec(str(spec))


@pytest.mark.parametrize("n", [-3, 0, 1.5, True])
def test_max_examples_below_one_is_refused(tmp_path, n) -> None:
    spec = load_spec(_mc_spec(tmp_path, {"choices": ["4", "5"], "gold": 0}))
    with pytest.raises(ConfigError, match="max_examples"):
        task_rows(spec, spec.tasks[0], max_examples=n)
    assert len(task_rows(spec, spec.tasks[0], max_examples=1)) == 1


# -- scaling ---------------------------------------------------------------------------------------
def test_fit_refuses_more_bootstrap_refits_than_the_maximum() -> None:
    from trainguard.scaling import MAX_BOOT
    from trainguard.scaling.fit import fit_scaling_law

    runs = [(n, d) for n in (1e6, 4e6, 1.6e7) for d in (1e8, 4e8)]
    loss = [1.7 + 400 / n**0.34 + 410 / d**0.28 for n, d in runs]
    n, d = zip(*runs, strict=True)
    with pytest.raises(ConfigError, match=f"n_boot must be in 0..{MAX_BOOT}, got 10000000"):
        fit_scaling_law(n, d, loss, n_boot=10_000_000)  # would allocate 335 GiB
