"""Load a recipe by shipped name or path, apply dotted `--set` overrides, validate.

Validation errors name the key and the allowed values, and raise `ConfigError` (exit 2).
"""

from __future__ import annotations

import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trainguard.config.identity import flatten
from trainguard.config.schema import Recipe
from trainguard.errors import ConfigError
from trainguard.util.inputs import read_text

# Keys that may differ between the recipe a run was started with and the one it resumes with.
# Keys a run dir may be resumed with changed: the step budget, where the metrics are also
# sent (they change no number of the run), whether the doctor runs first
# (`trainguard run --doctor`), the reference curve the run is compared with (a comparison
# restarts from the resumed step when the reference changes), and whether checkpoints are
# written in the background (the same files either way).
RESUMABLE_KEYS = frozenset(
    {
        "train.max_steps",
        "train.schedule_on_extend",
        "metrics.tb_dir",
        "metrics.wandb",
        "metrics.wandb_project",
        "metrics.wandb_mode",
        "preflight.doctor",
        "checkpoint.async_save",
        "checkpoint.queue",
        "checkpoint.when_full",
        "reference.path",
        "reference.enabled",
        "reference.force",
        "reference.interval",
        "reference.threshold",
        "reference.allowance",
    }
)


def shipped_recipes() -> list[str]:
    folder = resources.files("trainguard") / "recipes"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def read_recipe_yaml(
    path: str | Path, what: str = "recipe file", fix: str = "", *, text: str | None = None
) -> dict[str, Any]:
    """A recipe file (or its `text`) as a raw dict; ConfigError (exit 2) naming what is wrong:
    missing, a folder, not UTF-8, not YAML, empty, not a mapping."""
    fix = fix or f"give a path to a YAML recipe or one of the shipped names: {shipped_recipes()}"
    if text is None:
        text = read_text(path, what, fix, ConfigError)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} {path} is not valid YAML: {e}", fix) from None
    if raw is None:
        # An empty file (or only comments) is a truncated or unwritten recipe, not a request
        # for the schema's defaults under the name "default"; `{}` asks for those explicitly.
        raise ConfigError(
            f"{what} {path} is empty (no settings at all)",
            f"{fix}; a recipe of only the defaults is written `{{}}`",
        )
    if not isinstance(raw, dict):
        raise ConfigError(f"{what} {path} must be a mapping of sections (see docs/recipes.md)", fix)
    return raw


RECIPE_FILE = "recipe.yaml"
"""The recipe a run was started with, in its run dir (written by `train/rundir.py`)."""


def read_run_recipe(run_dir: str | Path) -> dict[str, Any]:
    """RUN_DIR/recipe.yaml (the recipe a run was started with) as a dict ({} when absent);
    ConfigError (exit 2) when damaged. Read by `run` on resume, `report` and `batch`."""
    path = Path(run_dir) / RECIPE_FILE
    if not path.exists():
        return {}
    fix = (
        f"restore {path} (trainguard wrote it when the run started), or start a new run "
        "with --run-dir NEW_DIR"
    )
    return read_recipe_yaml(path, "the run's recipe", fix)


def _read_recipe_file(name_or_path: str) -> tuple[dict[str, Any], str]:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return read_recipe_yaml(path), str(path)
    resource = resources.files("trainguard") / "recipes" / f"{name_or_path}.yaml"
    if not resource.is_file():
        raise ConfigError(
            f"unknown recipe {name_or_path!r}",
            f"use one of the shipped recipes {shipped_recipes()} or a path to a .yaml file",
        )
    origin, text = f"shipped recipe {name_or_path}", resource.read_text(encoding="utf-8")
    return read_recipe_yaml(name_or_path, "shipped recipe", text=text), origin


def _field_names(model: type[BaseModel]) -> list[str]:
    return sorted(model.model_fields)


def _section_model(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    """The pydantic model of a nested section, if the field is one (Optional included)."""
    ann = model.model_fields[key].annotation
    for candidate in (ann, *typing.get_args(ann)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply `a.b.c=value` to a raw recipe dict; the value is parsed as YAML (3e-4, true, null)."""
    if "=" not in assignment:
        raise ConfigError(
            f"override {assignment!r} has no '='", "write overrides as --set train.lr=3e-4"
        )
    dotted, value_text = assignment.split("=", 1)
    keys = dotted.strip().split(".")
    model: type[BaseModel] | None = Recipe
    node = raw
    for i, key in enumerate(keys):
        if model is None or key not in model.model_fields:
            where = ".".join(keys[:i]) or "the recipe"
            allowed = _field_names(model) if model else []
            raise ConfigError(
                f"unknown key {dotted!r} in override: {where} has no field {key!r}",
                f"allowed keys under {where}: {', '.join(allowed)}",
            )
        if i == len(keys) - 1:
            try:
                node[key] = yaml.safe_load(value_text) if value_text.strip() else None
            except yaml.YAMLError:
                node[key] = value_text
            return
        sub = _section_model(model, key)
        if sub is None and typing.get_origin(model.model_fields[key].annotation) is dict:
            # A mapping field (e.g. guards.actions): the rest of the dotted key is its key.
            mapping = node.setdefault(key, {}) if isinstance(node.get(key), dict) else {}
            node[key] = mapping
            mapping[".".join(keys[i + 1 :])] = yaml.safe_load(value_text)
            return
        model = sub
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]


# What a value of each type looks like, for the fix line of a strict-type error (StrictModel:
# no boolean is a number, no float a count, no 1 a boolean).
_EXPECTED = {
    "int_type": "a whole number (e.g. 300), not true/false or a fraction",
    "float_type": "a number (e.g. 3e-4 or 0.5), not true/false",
    "bool_type": "true or false",
    "string_type": "a string (quote it in YAML)",
}


def _format_validation_error(e: ValidationError, origin: str) -> ConfigError:
    problems, fixes = [], []
    for err in e.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(recipe)"
        if err["type"] == "extra_forbidden":
            parent = err["loc"][:-1]
            model: type[BaseModel] | None = Recipe
            for p in parent:
                model = _section_model(model, str(p)) if model else None
            allowed = ", ".join(_field_names(model)) if model else "?"
            problems.append(f"unknown key {key!r}")
            fixes.append(
                f"allowed keys under {'.'.join(map(str, parent)) or 'the recipe'}: {allowed}"
            )
        elif err["type"] == "literal_error":
            problems.append(f"{key}: got {err.get('input')!r}")
            fixes.append(f"{key} must be one of {err['ctx']['expected']}")
        else:
            problems.append(f"{key}: {err['msg']} (got {err.get('input')!r})")
            fixes.append(f"set {key} to {_EXPECTED.get(err['type'], 'a valid value')}")
    return ConfigError(f"invalid recipe ({origin}): " + "; ".join(problems), "; ".join(fixes))


def validate_recipe(raw: dict[str, Any], origin: str = "recipe") -> Recipe:
    try:
        return Recipe.model_validate(raw)
    except ValidationError as e:
        raise _format_validation_error(e, origin) from None


def load_recipe(name_or_path: str = "default", overrides: list[str] | None = None) -> Recipe:
    """The validated recipe with `--set` overrides applied in order."""
    raw, origin = _read_recipe_file(name_or_path)
    for assignment in overrides or []:
        apply_override(raw, assignment)
    return validate_recipe(raw, origin)


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    return recipe.model_dump(mode="json")


def recipe_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ, as {dotted key: (old, new)}."""
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
