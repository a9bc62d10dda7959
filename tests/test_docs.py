"""The generated reference pages match the code: a new key or code without regenerated docs
fails here, with the command that fixes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.codes import render_markdown as render_codes
from trainguard.config.docs import render_markdown as render_recipes

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize(
    ("page", "render", "command"),
    [
        ("recipes.md", render_recipes, "python -m trainguard.config > docs/recipes.md"),
        ("codes.md", render_codes, "python -m trainguard.codes > docs/codes.md"),
    ],
)
def test_generated_docs_are_current(page, render, command):
    assert (DOCS / page).read_text() == render(), f"docs/{page} is stale: run `{command}`"
