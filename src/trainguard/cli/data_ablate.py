"""`trainguard data ablate BASE --variant NAME=DATA ... --recipe RECIPE --evals SPEC`: did a
filter make a small model better on the use case, worse, or was the difference noise?

Each run is a normal guarded `trainguard run` in a process of its own (its own run dir, lock,
metric log and report), started by the runner below; `--jobs` of them at once, as many as the
machine's cores and memory hold by default (`util/processes.py`)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console, emit, err_console
from trainguard.data.corpus import ACCEPTED
from trainguard.errors import Interrupted, TrainguardError


def _runner(recipes_dir: Path):
    """runner(recipe, run_dir) for `run_grid`: `python -m trainguard run` on the cell's recipe,
    which resumes by itself from a run dir an interrupted ablation left."""
    from trainguard.config.load import recipe_to_dict
    from trainguard.util.atomic import atomic_write_text
    from trainguard.util.processes import child_env

    def run_one(recipe: Any, run_dir: Path) -> Any:
        import yaml

        path = recipes_dir / f"{run_dir.name}.yaml"
        atomic_write_text(path, yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False))
        cmd = [sys.executable, "-m", "trainguard", "run", str(path), "--run-dir", str(run_dir)]
        proc = subprocess.run(
            [*cmd, "--json", "-q"], capture_output=True, text=True, env=child_env(), check=False
        )
        if proc.returncode in (130, 143):  # Ctrl-C or SIGTERM reached the runs: stop here too
            raise Interrupted(signal.SIGINT if proc.returncode == 130 else signal.SIGTERM)
        try:  # `run --json` prints one (indented) JSON object on every exit
            result = json.loads(proc.stdout[proc.stdout.find("{") :]) if "{" in proc.stdout else {}
        except ValueError:
            result = {}
        result = result if isinstance(result, dict) else {}
        # Progress on stderr (stdout stays the report, or the JSON): minutes pass between.
        err_console.print(f"data ablate: run {run_dir.name} ended with exit {proc.returncode}")
        if proc.returncode != 0 or not result.get("ok"):
            why = (result.get("error") or {}).get("message") or proc.stderr.strip()[-400:]
            raise TrainguardError(f"exit {proc.returncode}: {why}", f"see {run_dir}")
        return SimpleNamespace(**result)

    return run_one


def _table(report: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="Effect of each variant: variant - base, paired by seed")
    for col in (
        "variant",
        "metric (bpb: lower is better)",
        "base",
        "diff [CI]",
        "p t/sign",
        "verdict",
    ):
        table.add_column(col)
    for name, v in report["variants"].items():
        for e in v["effects"]:
            table.add_row(
                name,
                e["metric"],
                f"{e['base_mean']:.4g}",
                f"{e['diff']:+.3g} [{e['low']:+.3g}, {e['high']:+.3g}]",
                f"{e['p_t']:.2g}/{e['p_sign']:.2g}",
                e["verdict"],
            )
    console.print(table)
    for name, v in report["variants"].items():
        console.print(f"{name}: {v['verdict']} on the use-case evals ({v['seeds']} seeds)")


def register(app: typer.Typer) -> None:
    data = group(app, "data")

    @data.command("ablate")
    def data_ablate(
        base: Annotated[str, typer.Argument(help=f"The unfiltered data: {ACCEPTED}.")],
        variant: Annotated[
            list[str],
            typer.Option(
                "--variant", help="NAME=DATA: a filtered version of BASE; repeat for more."
            ),
        ],
        recipe: Annotated[
            str, typer.Option("--recipe", help="The small recipe (name or YAML) every run uses.")
        ],
        evals: Annotated[
            list[str],
            typer.Option("--evals", help="Use-case eval spec (file or shipped name); repeat."),
        ],
        seeds: Annotated[int, typer.Option("--seeds", min=1, max=64, help="Seeds per data.")] = 3,
        out: Annotated[Path, typer.Option("--out", help="The ablation's folder.")] = Path(
            "runs/ablate"
        ),
        jobs: Annotated[
            int | None,
            typer.Option("--jobs", min=1, help="Runs at once. Default: what the machine holds."),
        ] = None,
        overrides: Annotated[
            list[str] | None, typer.Option("--set", help="Recipe override for every run.")
        ] = None,
        heldout_max: Annotated[
            int, typer.Option("--heldout-docs", min=1, help="Held-out documents at most.")
        ] = 200,
        plot: Annotated[
            Path | None,
            typer.Option("--plot", help="PNG of the effects. Default: OUT/effects.png."),
        ] = None,
        oversubscribe: Annotated[
            bool, typer.Option("--oversubscribe", help="Start --jobs runs even if they crowd.")
        ] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Train a small recipe on BASE and on each variant (same steps, same seeds) and report
        each variant's effect on the use-case evals and a shared held-out set, with a CI."""
        from trainguard.ablation.experiment import ablate

        report, findings = ablate(
            base,
            variant,
            recipe,
            evals,
            out,
            runner=_runner(out / "recipes"),
            seeds=seeds,
            jobs=jobs,
            overrides=overrides or [],
            heldout_max=heldout_max,
            plot=plot,
            oversubscribe=oversubscribe,
        )
        if not as_json:
            _table(report)
        emit(findings, as_json, extra=report, title="Data ablation")
