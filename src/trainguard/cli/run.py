"""`trainguard run [RECIPE]`: the main job."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli.common import console, findings_table, handle_errors
from trainguard.errors import EXIT_OK


def register(app: typer.Typer) -> None:
    @app.command("run")
    @handle_errors
    def run_command(
        recipe: Annotated[
            str, typer.Argument(help="A shipped recipe name (e.g. `default`) or a YAML path.")
        ] = "default",
        run_dir: Annotated[
            Path | None,
            typer.Option("--run-dir", help="Where the run lives. Default: runs/<recipe name>."),
        ] = None,
        overrides: Annotated[
            list[str] | None,
            typer.Option("--set", help="Override a recipe key, e.g. --set train.lr=3e-4."),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress output.")] = False,
        no_evals: Annotated[
            bool,
            typer.Option("--no-evals", help="Train without use-case evals, on purpose."),
        ] = False,
        nproc: Annotated[
            int | None,
            typer.Option(
                "--nproc",
                help="Train with N local processes (data parallel, torch.distributed's elastic "
                "launcher; gloo on CPU, nccl on GPU). For several machines run under torchrun.",
            ),
        ] = None,
        max_restarts: Annotated[
            int,
            typer.Option(
                "--max-restarts",
                help="With --nproc: restart all processes this many times after a failure "
                "(a hung rank exits 3); each restart resumes from the last checkpoint.",
            ),
        ] = 0,
        fresh: Annotated[
            bool,
            typer.Option(
                "--fresh",
                help="Start over at step 0 on purpose: the run dir's previous contents move to "
                "RUN_DIR/attic/<timestamp>/ (and an external checkpoint.dir's steps to its "
                "attic/); nothing is deleted.",
            ),
        ] = False,
        doctor: Annotated[
            bool,
            typer.Option(
                "--doctor",
                help="Run `trainguard doctor --quick` on every rank before training starts "
                "(recipe key preflight.doctor); an error stops the run.",
            ),
        ] = False,
    ) -> None:
        """Prepare data, run pre-flight checks, train with verified checkpoints and auto-resume,
        evaluate, and write a report. Running it again in the same run dir resumes."""
        from trainguard.config.load import load_recipe
        from trainguard.train.run import run_recipe

        if doctor:
            overrides = [*(overrides or []), "preflight.doctor=true"]
        resolved = load_recipe(recipe, overrides)  # bad recipes fail here, before any launch
        folder = run_dir or Path("runs") / resolved.name
        if nproc is not None:
            from trainguard.errors import ConfigError
            from trainguard.train.launch import launch

            if nproc > 0 and resolved.train.batch_size % nproc:
                raise ConfigError(
                    f"train.batch_size={resolved.train.batch_size} is not divisible by "
                    f"--nproc {nproc}",
                    "use a process count that divides train.batch_size (the global batch must "
                    "not depend on the process count)",
                )
            if fresh:  # here, once, before any worker looks at the run dir
                from trainguard.train.restore import start_fresh

                for f in start_fresh(resolved, folder):
                    console.print(f"{f.code}: {f.message}", markup=False, soft_wrap=True)
            worker = ["run", recipe, "--run-dir", str(folder)]
            for o in overrides or []:
                worker += ["--set", o]
            worker += ["--json"] if as_json else []
            worker += ["--quiet"] if quiet else []
            worker += ["--no-evals"] if no_evals else []
            raise typer.Exit(launch(nproc, worker, max_restarts))
        result = run_recipe(
            resolved, folder, progress=not (quiet or as_json), evals=not no_evals, fresh=fresh
        )
        if int(os.environ.get("RANK", "0")) != 0:
            raise typer.Exit(EXIT_OK)  # rank 0 speaks for the job
        # The run finished: faults it met were handled by its guards (they are in the findings
        # and the report). A halt or a failed pre-flight raises instead and exits 1.
        errors = [f for f in result.findings if f.severity == "error"]
        if as_json:
            payload = {
                "ok": not errors,
                "findings": [f.to_dict() for f in result.findings],
                "run_dir": str(result.run_dir),
                "final_step": result.final_step,
                "final_val_loss": result.final_val_loss,
                "final_val_bpb": result.final_val_bpb,
                "params": result.params,
                "tokens": result.tokens,
                "resumed_from": result.resumed_from,
            }
            sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        elif not quiet:
            if result.findings:
                console.print(findings_table(result.findings, "Run findings"))
            console.print(
                f"[bold]done[/]: step {result.final_step}, val_loss "
                f"{result.final_val_loss:.4f}, val_bpb {result.final_val_bpb:.4f}, "
                f"report {result.run_dir / 'report.html'}"
            )
        raise typer.Exit(EXIT_OK)

    @app.command("report")
    @handle_errors
    def report_command(
        run_dir: Annotated[Path, typer.Argument(help="A run dir written by `trainguard run`.")],
    ) -> None:
        """Regenerate RUN_DIR/report.html and RUN_DIR/report.md from the run's files."""
        from trainguard.report.build import write_report

        html_path, md_path = write_report(run_dir)
        console.print(f"wrote {html_path} and {md_path}")
