"""`trainguard scale run RECIPE --grid ...` and `trainguard scale fit RUNS.csv`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console, emit
from trainguard.config.schema import SEED_MAX
from trainguard.errors import BadInputError
from trainguard.scaling import MAX_BOOT
from trainguard.util.atomic import check_writable
from trainguard.util.paths import refuse_overwrite

if TYPE_CHECKING:
    from trainguard.scaling.fit import FitResult


def _parse_point(text: str) -> tuple[float, float]:
    try:
        n, d = (float(x) for x in text.split(","))
    except ValueError:
        raise BadInputError(
            f"--predict {text!r} is not N,D", "write --predict 70e9,1.4e12 (params,tokens)"
        ) from None
    if n <= 0 or d <= 0:
        raise BadInputError(f"--predict {text!r} must be positive", "params and tokens > 0")
    return n, d


def register(app: typer.Typer) -> None:
    scale = group(app, "scale")

    @scale.command("run")
    def scale_run(
        recipe: str = typer.Argument("default", help="Recipe name or path."),
        grid: list[str] = typer.Option(
            ...,
            "--grid",
            help="Axis KEY=V1,V2 over recipe keys, e.g. model.d_model=32,64; "
            "repeat for more axes (sizes x token budgets: train.max_steps=100,200).",
        ),
        out: Path = typer.Option(
            Path("runs/scale"), "--out", help="Folder for the cells' run dirs."
        ),
        csv_path: Path = typer.Option(
            None, "--csv", help="CSV to append to. Default: OUT/runs.csv."
        ),
        overrides: list[str] = typer.Option(None, "--set", help="Override for every cell."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Gating runs over the grid; appends params,tokens,loss rows to the CSV."""
        from trainguard.scaling.grid import parse_grid, run_grid
        from trainguard.train.guarded_run import run_recipe

        def run_cell(cell_recipe: Any, run_dir: Path) -> Any:
            return run_recipe(cell_recipe, run_dir, progress=False)

        csv_file = csv_path or out / "runs.csv"
        rows, findings = run_grid(
            recipe, parse_grid(grid), out, csv_file, runner=run_cell, overrides=overrides
        )
        emit(findings, as_json, extra={"csv": str(csv_file), "rows": rows}, title="Scale run")

    @scale.command("fit")
    def scale_fit(
        runs: Path = typer.Argument(..., help="CSV with params,tokens,loss columns."),
        predict: list[str] = typer.Option(None, "--predict", help="N,D to predict; repeatable."),
        boot: int = typer.Option(
            200, "--boot", min=0, max=MAX_BOOT, help="Bootstrap refits (memory grows with them)."
        ),
        level: float = typer.Option(0.95, "--level", min=0.5, max=0.999, help="Band coverage."),
        plot: Path = typer.Option(None, "--plot", help="Write a PNG of data, fit and band."),
        seed: int = typer.Option(0, "--seed", min=0, max=SEED_MAX, help="Bootstrap seed."),
        band: Path = typer.Option(
            None,
            "--band",
            help="Write the prediction band over tokens for the (single) "
            "--predict point as JSON, for the big run's off-track alarm.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Fit L(N, D) = E + A/N^alpha + B/D^beta (Chinchilla approach 3) with bootstrap bands."""
        result, extra = fit_runs(runs, predict or [], boot, level, seed, plot=plot, band=band)
        if not as_json:
            _print_fit(result, extra["predictions"])
        emit(result.findings, as_json, extra=extra, title="Scaling fit")


def fit_runs(
    runs: Path,
    predict: list[str],
    boot: int = 200,
    level: float = 0.95,
    seed: int = 0,
    *,
    plot: Path | None = None,
    band: Path | None = None,
) -> tuple[FitResult, dict[str, Any]]:
    """`trainguard scale fit`: (the fit, the JSON's fields) of the runs CSV, with predictions
    at each `N,D` of `predict`, the plot and the prediction band (one `--predict` point)
    written where asked; both outputs are checked before the bootstrap."""
    from trainguard.scaling.fit import fit_scaling_law
    from trainguard.scaling.grid import read_runs_csv

    points = [_parse_point(p) for p in predict]
    if band is not None and len(points) != 1:
        raise BadInputError(
            "--band needs exactly one --predict N,D (the big run's size and budget)",
            "give one --predict with --band",
        )
    refuse_overwrite({"--band": band, "--plot": plot}, {"RUNS": runs})
    n, d, loss = read_runs_csv(runs)
    for out in (band, plot):
        if out is not None:
            check_writable(out)  # before the bootstrap, which takes the time
    result = fit_scaling_law(n, d, loss, n_boot=boot, seed=seed)
    preds = result.predictions(points, level)
    extra = {"fit": result.law.to_dict(), "predictions": preds}
    if plot is not None:
        from trainguard.scaling.plot import plot_fit

        extra["plot"] = str(plot_fit(result, n, d, loss, plot, preds))
    if band is not None:
        from trainguard.scaling.offtrack import PredictionBand

        pb = PredictionBand.from_fit(result, points[0][0], points[0][1], level=level)
        extra["band"] = str(pb.save(band))
    return result, extra


def _print_fit(result: FitResult, preds: list[dict[str, Any]]) -> None:
    law = result.law
    console.print(
        f"L(N, D) = {law.E:.4g} + {law.A:.4g} / N^{law.alpha:.4f} + "
        f"{law.B:.4g} / D^{law.beta:.4f}   ({result.n_runs} runs)"
    )
    for p in preds:
        console.print(
            f"N={p['params']:.3g} D={p['tokens']:.3g}: loss {p['loss']:.4f} "
            f"[{p['low']:.4f}, {p['high']:.4f}]"
        )
