"""Recipe validation: unknown keys, bad values and bad overrides name the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from runhelpers import invoke_cli
from trainguard.config import load_recipe, recipe_diff, recipe_to_dict, shipped_recipes
from trainguard.config.schema import Recipe
from trainguard.errors import ConfigError


def test_default_recipe_ships_and_validates() -> None:
    assert "default" in shipped_recipes()
    recipe = load_recipe("default")
    assert recipe.name == "default"
    assert recipe.data.source == "stdlib"
    assert recipe.tokenizer.vocab_size == 4096


@pytest.mark.parametrize(
    ("assignment", "attr", "expected"),
    [
        ("train.max_steps=7", ("train", "max_steps"), 7),
        ("train.batch_size=4", ("train", "batch_size"), 4),
        ("train.grad_accum=2", ("train", "grad_accum"), 2),
        ("train.lr=3e-4", ("train", "lr"), 3e-4),
        ("train.seed=9", ("train", "seed"), 9),
        ("train.precision=bf16", ("train", "precision"), "bf16"),
        ("checkpoint.interval=5", ("checkpoint", "interval"), 5),
        ("checkpoint.keep=2", ("checkpoint", "keep"), 2),
        ("model.n_layers=3", ("model", "n_layers"), 3),
        ("model.d_model=96", ("model", "d_model"), 96),
        ("model.n_heads=8", ("model", "n_heads"), 8),
        ("data.seq_len=64", ("data", "seq_len"), 64),
    ],
)
def test_documented_overrides_apply(assignment: str, attr: tuple[str, str], expected) -> None:
    recipe = load_recipe("default", [assignment])
    assert getattr(getattr(recipe, attr[0]), attr[1]) == expected


def test_every_field_has_a_docstring() -> None:
    def walk(model: type) -> None:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
            ann = field.annotation
            for sub in (ann, *getattr(ann, "__args__", ())):
                if isinstance(sub, type) and hasattr(sub, "model_fields"):
                    walk(sub)

    walk(Recipe)


def test_unknown_override_key_names_allowed_keys() -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe("default", ["train.learning_rate=1"])
    assert "train.learning_rate" in e.value.message
    assert "lr" in e.value.fix and "max_steps" in e.value.fix


def test_literal_error_names_allowed_values() -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe("default", ["train.precision=fp16"])
    assert "train.precision" in str(e.value)
    assert "fp32" in e.value.fix and "bf16" in e.value.fix


def test_unknown_key_in_file_rejected(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "train": {"max_step": 3}}))
    with pytest.raises(ConfigError) as e:
        load_recipe(str(path))
    assert "train.max_step" in e.value.message
    assert "max_steps" in e.value.fix


def test_heads_must_divide_width() -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe("default", ["model.n_heads=5"])
    assert "n_heads" in str(e.value)


def test_bad_values_rejected() -> None:
    for bad in ("train.max_steps=0", "train.lr=-1", "data.seq_len=abc"):
        with pytest.raises(ConfigError):
            load_recipe("default", [bad])


def test_override_without_equals() -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe("default", ["train.lr"])
    assert "--set" in e.value.fix


def test_recipe_diff_lists_changed_keys() -> None:
    a = recipe_to_dict(load_recipe("default"))
    b = recipe_to_dict(load_recipe("default", ["train.lr=1e-4", "train.max_steps=9"]))
    assert set(recipe_diff(a, b)) == {"train.lr", "train.max_steps"}


def test_cli_bad_recipe_exit_2(tmp_path: Path) -> None:
    res = invoke_cli("run", "default", "--set", "train.precision=fp16", "--run-dir", str(tmp_path))
    assert res.returncode == 2
    assert "train.precision" in res.stderr and "bf16" in res.stderr
    res = invoke_cli("run", "no-such-recipe", "--run-dir", str(tmp_path))
    assert res.returncode == 2
    assert "default" in res.stderr  # names the shipped recipes
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [unclosed\n")
    res = invoke_cli("run", str(broken), "--run-dir", str(tmp_path / "r"))
    assert res.returncode == 2
    assert "YAML" in res.stderr
