"""Which reference a run is compared with: `reference.path`, else a shipped one recorded at
exactly the run's recipe; and the refusal of a reference recorded for another recipe."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from trainguard.config.identity import curve_differences, curve_recipe, recipe_hash
from trainguard.errors import BadInputError
from trainguard.findings import Finding
from trainguard.reference.curve import ReferenceCurve, load_reference

SUFFIX = ".ref.json"


@dataclass
class Selected:
    curve: ReferenceCurve
    origin: str
    """How findings name it: "reference PATH" or "the shipped reference NAME"."""
    differences: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Curve keys that differ (only with reference.force)."""
    findings: list[Finding] = field(default_factory=list)


def shipped_references(name: str) -> list[Path]:
    """`recipes/<name>.ref.json` and `recipes/<name>.<variant>.ref.json` shipped with trainguard
    (`default.ref.json` at the shipped settings, `default.ci.ref.json` at CI's tiny ones)."""
    folder = Path(str(resources.files("trainguard") / "recipes"))
    return sorted(
        p
        for p in folder.glob(f"{name}*{SUFFIX}")
        if p.name == f"{name}{SUFFIX}" or p.name.startswith(f"{name}.")
    )


def _listing(differences: dict[str, tuple[Any, Any]], limit: int = 12) -> str:
    items = [f"{k}: {a!r} in the reference, {b!r} here" for k, (a, b) in differences.items()]
    more = len(items) - limit
    return "; ".join(items[:limit]) + (f"; and {more} more" if more > 0 else "")


def select_reference(recipe: dict[str, Any]) -> Selected | None:
    """The reference for the resolved recipe (`recipe_to_dict`), or None. BadInputError (exit
    2) for an unreadable file or another recipe's reference without `reference.force`."""
    cfg = recipe.get("reference") or {}
    if not cfg.get("enabled", True):
        return None
    ours = curve_recipe(recipe)
    if cfg.get("path"):
        path = Path(cfg["path"]).expanduser()
        curve = load_reference(path)
        differences = curve_differences(curve.recipe, ours)
        if differences and not cfg.get("force"):
            raise BadInputError(
                f"reference {path} was recorded for another recipe ({curve.recipe_name!r}, "
                f"{len(differences)} key(s) differ: {_listing(differences)})",
                "use a reference recorded for this recipe (`trainguard reference record`), "
                "change the recipe back, or compare anyway with `trainguard run --force` "
                "(reference.force=true)",
            )
        selected = Selected(curve, f"reference {path}", differences)
        if differences:
            selected.findings.append(
                Finding.of(
                    "R505",
                    f"reference {path} was recorded for another recipe; compared anyway "
                    f"(reference.force), with the band only: {_listing(differences)}",
                    data={"differences": {k: list(v) for k, v in differences.items()}},
                )
            )
        return selected
    wanted = recipe_hash(recipe)
    for path in shipped_references(str(recipe.get("name", ""))):
        curve = load_reference(path)  # a damaged shipped file is a packaging bug: say so
        if curve.recipe_hash == wanted:
            return Selected(curve, f"the shipped reference {path.name}")
    return None
