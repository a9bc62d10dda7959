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


# --- the fire-drill matrix in docs/drills.md (trainguard.drills.readme) ------------------------
DRILLS_PAGE = DOCS / "drills.md"
REGENERATE = "python -m trainguard.drills.readme docs/drills.md"


def test_readme_drill_matrix_lists_every_drill_in_order():
    from trainguard.drills.readme import row_for, table_in
    from trainguard.drills.scenarios import DRILLS

    table = table_in(DRILLS_PAGE.read_text())
    faults = [d.fault for d in DRILLS.values()]
    rows = [row_for(table, f) for f in faults]
    missing = [f for f, r in zip(faults, rows, strict=True) if r is None]
    assert not missing, f"the drill matrix lacks {missing}: run `{REGENERATE}`"
    body = table.splitlines()[2:]
    assert rows == body, f"the drill matrix is not in the drills' order: run `{REGENERATE}`"


def test_readme_drill_matrix_precision_row_is_what_the_code_renders(tmp_path):
    """The one drill fast enough for the default run (no training, no data); the whole matrix
    is compared in the slow set (tests/test_drill.py::test_default_recipe_drill_matrix)."""
    from trainguard.drills.matrix import matrix_markdown
    from trainguard.drills.readme import normalise, row_for, table_in
    from trainguard.drills.runner import DrillContext
    from trainguard.drills.scenarios import DRILLS

    drill = DRILLS["precision"]
    rendered = matrix_markdown([drill.run(DrillContext(workdir=tmp_path))])
    want = row_for(rendered, drill.fault)
    got = row_for(table_in(DRILLS_PAGE.read_text()), drill.fault)
    assert got is not None and normalise(got) == normalise(want), f"run `{REGENERATE}`"


def test_drill_matrix_normalisation_hides_hosts_and_timings_only():
    from trainguard.drills.readme import normalise, table_in, with_table

    a = "| x | R210 | exit 3 (forward, 5.18s); rank 1 (vm) named, score 0.31 | 6.9172 |"
    b = "| x | R210 | exit 3 (forward, 12s); rank 1 (gpu-7.local) named, score 1.4 | 6.9172 |"
    assert normalise(a) == normalise(b)
    doctor = "| d | H401 | 0 | rank 1 (vm) named; doctor exit 1 in 18.1s | yes |"
    assert normalise(doctor) == normalise(doctor.replace("18.1s", "35s").replace("vm", "n2"))
    assert normalise(a) != normalise(a.replace("6.9172", "6.9173"))  # losses are compared
    assert normalise(a) != normalise(a.replace("rank 1", "rank 2"))  # so are the ranks named
    page = DRILLS_PAGE.read_text()
    assert with_table(page, table_in(page)) == page
    with pytest.raises(ValueError, match="drill-matrix"):
        table_in("# a README without markers\n")
