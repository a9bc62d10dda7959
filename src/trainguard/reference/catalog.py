"""The shipped recipes as a tested library: what each is for, the references shipped next to it
(`<name>.ref.json` at its own settings, `<name>.ci.ref.json` at CI's tiny ones) and what was
tested where. `trainguard recipes` prints it; tests/test_recipes.py runs every recipe at its CI
settings against its CI reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from trainguard.config.identity import recipe_hash
from trainguard.config.load import load_recipe, recipe_to_dict, shipped_recipes
from trainguard.errors import BadInputError
from trainguard.reference.curve import load_reference

# Tiny settings every recipe is run at in CI (a few seconds on CPU); a recipe's own `ci_extra`
# comes after them. CI adds data.source and data.cache_dir for its small corpus: both are
# operational (where, not what), so the recipe hash is the same on every machine.
CI_SETTINGS: tuple[str, ...] = (
    "data.seq_len=32",
    "data.val_fraction=0.1",
    "tokenizer.vocab_size=512",
    "model.n_layers=2",
    "model.d_model=64",
    "model.n_heads=2",
    "train.batch_size=8",
    "train.grad_accum=1",
    "train.max_steps=20",
    "train.warmup_steps=2",
    "train.eval_interval=10",
    "train.eval_batches=2",
    "train.threads=1",
    "checkpoint.interval=10",
    "preflight.enabled=false",
)
RECORD_CI = "pytest tests/test_recipes.py --record-references"
RECORD_FULL = (
    "trainguard run {name} --run-dir runs/{name}-reference --no-evals && trainguard reference "
    "record runs/{name}-reference --out src/trainguard/recipes/{name}.ref.json"
)


@dataclass(frozen=True)
class Entry:
    purpose: str
    device: str
    """Where the full-size reference must be recorded: "cpu" or "cuda"."""
    ci_extra: tuple[str, ...] = ()


CATALOG: dict[str, Entry] = {
    "default": Entry("The demo, and the starting point for CPU experiments.", "cpu"),
    "moe-dropless": Entry(
        "Mixture-of-experts training without dropped tokens (token-choice top-2, dropless "
        "dispatch, load-balancing loss) on a real model.",
        "cpu",
    ),
    "gpt-small-gpu": Entry(
        "A realistic small GPT (GPT-2 small shape) for one GPU in bf16, to point at your corpus.",
        "cuda",
        ("train.precision=fp32",),  # CPU CI runs in fp32; bf16 autocast is the GPU's setting
    ),
}


def ci_settings(name: str) -> list[str]:
    return [*CI_SETTINGS, *CATALOG[name].ci_extra]


def reference_path(name: str, ci: bool) -> Path:
    folder = Path(str(resources.files("trainguard") / "recipes"))
    return folder / f"{name}{'.ci' if ci else ''}.ref.json"


def _where(env: dict[str, Any]) -> str:
    parts = [str(env.get("device")), str(env.get("cpu") or "")]
    parts += [f"torch {env.get('torch')}", f"Python {env.get('python')}"]
    if env.get("cuda"):
        parts.append(f"CUDA {env['cuda']}, driver {env.get('driver')}")
    return ", ".join(p for p in parts if p)


def _reference(name: str, ci: bool) -> dict[str, Any]:
    settings = ci_settings(name) if ci else []
    path = reference_path(name, ci)
    wanted = recipe_hash(recipe_to_dict(load_recipe(name, settings)))
    row: dict[str, Any] = {
        "file": path.name,
        "settings": "CI (tiny)" if ci else "shipped",
        "overrides": settings,
    }
    if not path.is_file():
        entry = CATALOG[name]
        pending = "pending a GPU run" if entry.device == "cuda" and not ci else "pending"
        how = RECORD_CI if ci else RECORD_FULL.format(name=name)
        return {**row, "status": pending, "record_with": how}
    curve = load_reference(path)
    status = "current" if curve.recipe_hash == wanted else "stale: the recipe changed since"
    return {
        **row,
        "status": status,
        **curve.summary(),
        "where_text": _where(curve.env),
        "record_with": RECORD_CI if ci else RECORD_FULL.format(name=name),
    }


def describe(name: str) -> dict[str, Any]:
    """One recipe's entry in `trainguard recipes`."""
    if name not in CATALOG:
        raise BadInputError(
            f"recipe {name!r} is not in the tested library", f"use one of {sorted(CATALOG)}"
        )
    recipe = load_recipe(name)
    ci, full = _reference(name, ci=True), _reference(name, ci=False)
    tested = {
        "ci": (
            f"{ci['steps']} steps at tiny settings on CPU in fp32, in every CI run "
            f"(tests/test_recipes.py) against {ci['file']}, recorded on {ci['where_text']}"
            if ci["status"] == "current"
            else f"CI reference {ci['status']}: {ci['record_with']}"
        ),
        "full": (
            f"the reference is a {full['steps']}-step run at the shipped settings on "
            f"{full['where_text']}, recorded {full['recorded_at']} ({full['file']}; not rerun "
            "in CI)"
            if full["status"] == "current"
            else f"reference {full['status']}: {full['record_with']}"
        ),
    }
    return {
        "name": name,
        "description": recipe.description,
        "purpose": CATALOG[name].purpose,
        "device": CATALOG[name].device,
        "recipe_hash": recipe_hash(recipe_to_dict(recipe)),
        "tested": tested,
        "references": [full, ci],
    }


def catalog() -> list[dict[str, Any]]:
    """Every shipped recipe: the tested library first, then any other shipped recipe."""
    out = [describe(n) for n in CATALOG]
    for name in shipped_recipes():
        if name not in CATALOG:
            out.append({"name": name, "description": load_recipe(name).description})
    return out
