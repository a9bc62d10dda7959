"""Recipes: the typed schema and loading with overrides."""

from trainguard.config.load import (
    RESUMABLE_KEYS,
    load_recipe,
    recipe_diff,
    recipe_to_dict,
    shipped_recipes,
)
from trainguard.config.schema import Recipe

__all__ = [
    "RESUMABLE_KEYS",
    "Recipe",
    "load_recipe",
    "recipe_diff",
    "recipe_to_dict",
    "shipped_recipes",
]
