"""`scale run`: gating runs over a grid of model sizes x token budgets, one CSV row each.

Each cell is a normal guarded run of the recipe with the cell's overrides, in its own run dir.
The runner is injected (the CLI passes `train.guarded_run.run_recipe`): scaling sits below the
run in the layers (docs/architecture.md) and never imports it. Rows (name, params, tokens, loss,
run_dir) are appended to the CSV as each cell finishes, so an interrupted grid keeps what it
has; cells already in the CSV are skipped. `jobs` cells run at once (threads that each wait on
their runner: the runner starts a process of its own, as `data ablate`'s does; an in-process
runner such as `scale run`'s sets process-wide torch state and runs one at a time).
"""

from __future__ import annotations

import csv
import io
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
    jobs: int = 1,
    names: Callable[[dict[str, Any]], str] = cell_name,
    command: str = "trainguard scale run",
) -> tuple[list[dict[str, Any]], list[Finding]]:
    """Run every cell not yet in the CSV with `runner(recipe, run_dir)`, `jobs` at a time;
    returns (rows written now, findings). `names(cell)` names a cell's run dir and CSV row.

    The output folder is locked for the whole grid (`OUT/.lock`): a second `command` on it
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
    with FolderLock(out_dir, command, flag="--out"):
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        done = done_cells(csv_path)
        todo = [(names(c), c, r) for c, r in zip(cells, recipes, strict=True)]
        todo = [t for t in todo if t[0] not in done]
        rows: list[dict[str, Any]] = []
        failed: list[tuple[str, Finding]] = []
        csv_lock = threading.Lock()  # one CSV writer at a time: each append rewrites it
        stop = threading.Event()  # set when a cell raised (an interrupt): start no other

        def one(name: str, cell: dict[str, Any], cell_recipe: Any) -> None:
            if stop.is_set():
                return
            try:
                row, finding = _run_cell(name, cell, cell_recipe, out_dir, runner)
            except BaseException:
                stop.set()
                raise
            with csv_lock:
                if finding is not None:
                    failed.append((name, finding))
                    return
                append_row(csv_path, row)
                rows.append(row)

        if jobs <= 1:
            for t in todo:
                one(*t)
        else:
            pool = ThreadPoolExecutor(max_workers=jobs)
            try:
                for fut in [pool.submit(one, *t) for t in todo]:
                    fut.result()  # re-raise what a cell raised (an interrupt, a full disk)
            finally:
                # After an interrupt no new cell starts (`stop`; the queue is dropped); the
                # running ones end with their runs.
                pool.shutdown(wait=True, cancel_futures=True)
        # The grid's order, whatever finished first: the same output from the same grid.
        order = {t[0]: i for i, t in enumerate(todo)}
        rows.sort(key=lambda r: order[r["name"]])
        return rows, [f for _, f in sorted(failed, key=lambda nf: order[nf[0]])]


def _run_cell(
    name: str, cell: dict[str, Any], cell_recipe: Any, out_dir: Path, runner: Runner
) -> tuple[dict[str, Any], Finding | None]:
    run_dir = out_dir / name
    try:
        result = runner(cell_recipe, run_dir)
    except TrainguardError as e:
        msg = f"gating run {name} failed: {e.message}"
        return {}, Finding.of("E161", msg, where=str(run_dir), data={"cell": cell})
    loss = getattr(result, "final_val_loss", None)
    if loss is None or loss != loss:  # None or NaN
        msg = f"gating run {name} produced no validation loss"
        return {}, Finding.of("E161", msg, where=str(run_dir), data={"cell": cell})
    row = {
        "name": name,
        "params": int(result.params),
        "tokens": int(result.tokens),
        "loss": float(loss),
        "run_dir": str(run_dir),
    }
    return row, None


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
