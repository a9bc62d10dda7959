"""`scale run`: gating runs over a grid of model sizes x token budgets, one CSV row each.

Each cell is a normal guarded run of the recipe with the cell's overrides, in its own run dir.
The runner is injected (the CLI passes `train.run.run_recipe`): scaling sits below the run in
the layers (docs/architecture.md) and never imports it. Rows (name, params, tokens, loss,
run_dir) are appended to the CSV as each cell finishes, so an interrupted grid keeps what it
has; cells already in the CSV are skipped.
"""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from trainguard.errors import BadInputError, TrainguardError
from trainguard.findings import Finding
from trainguard.util.atomic import atomic_write_text, check_writable
from trainguard.util.inputs import read_text
from trainguard.util.paths import refuse_overwrite
from trainguard.util.runlock import FolderLock

FIELDS = ["name", "params", "tokens", "loss", "run_dir"]

# runner(recipe, run_dir) -> an object with params, tokens, final_val_loss (RunResult).
Runner = Callable[[Any, Path], Any]


def parse_grid(axes: list[str]) -> list[tuple[str, list[Any]]]:
    """`["model.d_model=32,64", "train.max_steps=100,200"]` -> [(key, [values]), ...]."""
    out = []
    for axis in axes:
        if "=" not in axis:
            raise BadInputError(
                f"grid axis {axis!r} has no '='",
                "write axes as --grid model.d_model=32,64 --grid train.max_steps=100,200",
            )
        key, values = axis.split("=", 1)
        parsed = [yaml.safe_load(v) for v in values.split(",") if v.strip()]
        if not parsed:
            raise BadInputError(f"grid axis {key!r} has no values", f"e.g. --grid {key}=1,2")
        out.append((key.strip(), parsed))
    if not out:
        raise BadInputError("the grid is empty", "give at least one --grid KEY=V1,V2")
    return out


def grid_cells(axes: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    keys = [k for k, _ in axes]
    return [
        dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(v for _, v in axes))
    ]


def cell_name(cell: dict[str, Any]) -> str:
    return "_".join(f"{k.split('.')[-1]}={v}" for k, v in cell.items())


def done_cells(csv_path: Path) -> set[str]:
    """Names of the cells the CSV already holds; BadInputError if it is not a `scale run` CSV.

    Checked before any cell runs: a CSV that cannot take the rows must not cost the grid."""
    if not csv_path.exists():
        return set()
    text = read_text(csv_path, "runs CSV", "give --csv a new file or one `scale run` wrote")
    if not text.strip():
        return set()
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if reader.fieldnames != FIELDS:
        raise BadInputError(
            f"runs CSV {csv_path} has the columns {reader.fieldnames}; `scale run` appends "
            f"rows of {','.join(FIELDS)}",
            "give --csv a new file or one `scale run` wrote",
        )
    return {row["name"] for row in reader}


def append_row(csv_path: Path, row: dict[str, Any]) -> None:
    """Add one row; the CSV is rewritten atomically, so a failed write leaves it as it was."""
    old = csv_path.read_text(encoding="utf-8") if csv_path.is_file() else ""
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=FIELDS)
    if not old.strip():
        old = ""
        writer.writeheader()
    writer.writerow({k: row[k] for k in FIELDS})
    atomic_write_text(csv_path, old + buf.getvalue())


def run_grid(
    recipe: str,
    axes: list[tuple[str, list[Any]]],
    out_dir: str | Path,
    csv_path: str | Path,
    *,
    runner: Runner,
    overrides: list[str] | None = None,
) -> tuple[list[dict[str, Any]], list[Finding]]:
    """Run every cell not yet in the CSV with `runner(recipe, run_dir)`; returns (rows written
    now, findings).

    The output folder is locked for the whole grid (`OUT/.lock`): a second `scale run` on it
    exits 2 naming the holder."""
    from trainguard.config.load import load_recipe

    out_dir, csv_path = Path(out_dir), Path(csv_path)
    cells = grid_cells(axes)
    # Check everything before running any cell: a typo in the last cell or a CSV that cannot
    # take the rows must not cost the grid.
    recipe_file = recipe if Path(recipe).is_file() else None
    refuse_overwrite({"--csv": csv_path, "--out": out_dir}, {"RECIPE": recipe_file})
    check_writable(csv_path)
    done_cells(csv_path)  # a CSV that cannot take the rows fails now; read again under the lock
    check_writable(out_dir, folder=True)
    recipes = [
        load_recipe(recipe, [*(overrides or []), *(f"{k}={v}" for k, v in c.items())])
        for c in cells
    ]
    with FolderLock(out_dir, "trainguard scale run", flag="--out"):
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        return _run_cells(cells, recipes, out_dir, csv_path, runner)


def _run_cells(
    cells: list[dict[str, Any]],
    recipes: list[Any],
    out_dir: Path,
    csv_path: Path,
    runner: Runner,
) -> tuple[list[dict[str, Any]], list[Finding]]:
    done = done_cells(csv_path)
    rows, findings = [], []
    for cell, cell_recipe in zip(cells, recipes, strict=True):
        name = cell_name(cell)
        if name in done:
            continue
        run_dir = out_dir / name
        try:
            result = runner(cell_recipe, run_dir)
        except TrainguardError as e:
            findings.append(
                Finding.of(
                    "E161",
                    f"gating run {name} failed: {e.message}",
                    where=str(run_dir),
                    data={"cell": cell},
                )
            )
            continue
        loss = getattr(result, "final_val_loss", None)
        if loss is None or loss != loss:  # None or NaN
            findings.append(
                Finding.of(
                    "E161",
                    f"gating run {name} produced no validation loss",
                    where=str(run_dir),
                    data={"cell": cell},
                )
            )
            continue
        row = {
            "name": name,
            "params": int(result.params),
            "tokens": int(result.tokens),
            "loss": float(loss),
            "run_dir": str(run_dir),
        }
        append_row(csv_path, row)
        rows.append(row)
    return rows, findings


def read_runs_csv(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(params, tokens, loss) from a CSV with at least those three columns."""
    path = Path(path)
    text = read_text(path, "runs CSV", "give the CSV `scale run` wrote")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = {"params", "tokens", "loss"} - set(reader.fieldnames or [])
    if missing:
        raise BadInputError(
            f"{path} lacks columns {sorted(missing)} (has {reader.fieldnames})",
            "the CSV needs a header with params,tokens,loss",
        )
    rows = []
    for i, row in enumerate(reader, start=2):
        try:
            rows.append((float(row["params"]), float(row["tokens"]), float(row["loss"])))
        except (TypeError, ValueError):
            raise BadInputError(
                f"{path} line {i}: params, tokens and loss must be numbers, got {row}",
                "fix or delete that line",
            ) from None
    if not rows:
        raise BadInputError(f"{path} has no runs", "run `trainguard scale run` first")
    arr = np.array(rows)
    return arr[:, 0], arr[:, 1], arr[:, 2]
