"""`trainguard run [RECIPE]`: the main job.

With `--json` every exit prints exactly one JSON object on stdout (`RunResult.to_dict`), and its
`ok` agrees with the exit status: finished (0), halted, stopped by pre-flight, D104 or C107, or a
checkpoint that could not be written (1), bad input or usage (2), a hang (3), interrupted (130,
143). A refused run changes nothing in its run dir. Under `--nproc` the launcher prints it:
rank 0 of the last attempt writes its result to the file RESULT_ENV names.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperCommand

from trainguard.cli._episodes import episodes_table
from trainguard.cli.common import console, err_console
from trainguard.errors import ConfigError, ExitStatus, Interrupted
from trainguard.findings import group_episodes
from trainguard.train.outcome import RunResult, describe_error
from trainguard.util.paths import refuse_overwrite

if TYPE_CHECKING:
    from trainguard.config.schema import Recipe

RESULT_ENV = "TRAINGUARD_RUN_RESULT"
# click's UsageError, whichever click typer uses (its own copy in recent versions).
_UsageError: type[Exception] = typer.BadParameter.__bases__[0]


class _RunCommand(TyperCommand):
    """`run --json` answers a usage error found by the parser with its one JSON object too."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes `args`
        try:
            return super().parse_args(ctx, args)
        except _UsageError as e:
            if "--json" in given:
                result = RunResult.empty(None)
                result.exit_status = e.exit_code  # type: ignore[attr-defined]  (2)
                result.error = {
                    "type": "UsageError",
                    "message": e.format_message(),  # type: ignore[attr-defined]
                    "fix": "see `trainguard run --help`",
                }
                _RunOutput(as_json=True, quiet=True).end(result)
            raise


class _RunOutput:
    """Prints a run's outcome once, from whichever exit path gets there first."""

    def __init__(self, as_json: bool, quiet: bool) -> None:
        self.as_json = as_json
        self.quiet = quiet
        self.done = False

    def end(self, result: RunResult) -> None:
        if self.done or int(os.environ.get("RANK", "0")) != 0:  # rank 0 speaks for the job
            return
        self.done = True
        if self.as_json:
            target = os.environ.get(RESULT_ENV)
            shown = result.to_dict()
            if not target:  # the launcher of `run --nproc` adds it once the job has ended
                shown["goodput"] = _goodput(result.run_dir)
            text = json.dumps(shown, indent=2, default=str) + "\n"
            if target:  # a worker of `run --nproc --json`: the launcher prints it
                Path(target).write_text(text, encoding="utf-8")
            else:
                sys.stdout.write(text)
                sys.stdout.flush()
        elif result.ok and not self.quiet:
            if result.findings:  # one line per episode: 50 NaN steps are one event
                console.print(episodes_table(group_episodes(result.findings), "Run findings"))
            if result.skipped_steps:
                steps = ", ".join(map(str, sorted(result.skipped_steps)[:20]))
                more = "..." if len(result.skipped_steps) > 20 else ""
                console.print(
                    f"skipped updates: {len(result.skipped_steps)} (steps {steps}{more}); "
                    "no training-loss average includes them (run averages none)"
                )
            console.print(
                f"[bold]done[/]: step {result.final_step}, val_loss "
                f"{result.final_val_loss:.4f}, val_bpb {result.final_val_bpb:.4f}, "
                f"report {escape(str(result.run_dir / 'report.html'))}",
                markup=True,
            )


def _goodput(run_dir: Path | None) -> dict[str, Any] | None:
    """Where the run's wall time went, across its restarts (docs/goodput.md); None for a run
    dir without a metric log (a refused run)."""
    from trainguard.goodput.accounting import account_run
    from trainguard.metrics.jsonl import METRICS_FILE

    if run_dir is None or not (run_dir / METRICS_FILE).is_file():
        return None
    try:
        return account_run(run_dir).to_dict()
    except Exception:  # the record is unreadable: the run's own outcome still prints
        return None


def _launch_job(
    folder: Path, nproc: int, worker: list[str], max_restarts: int, fresh: Recipe | None
) -> RunResult:
    """`run --nproc`: hold the run dir's lock here for the workers (they know this process by
    the pid in TRAINGUARD_LOCK_HOLDER), set the previous run aside for `--fresh` (`fresh`: the
    recipe), launch them, and collect rank 0's result."""
    from trainguard.guard.watchdog import remove_unused_backstops
    from trainguard.train.launch import launch
    from trainguard.train.rundir import ensure_writable
    from trainguard.train.start import start_fresh
    from trainguard.util.runlock import HOLDER_ENV, FolderLock

    ensure_writable(folder)
    with FolderLock(folder, "trainguard run --nproc"), tempfile.TemporaryDirectory() as tmp:
        # Under the lock with no worker alive, the empty backstop files are killed runs' (the
        # agent stops workers with SIGTERM, whose default action they keep).
        remove_unused_backstops(folder)
        if fresh is not None:  # here, once, under the lock, before any worker looks
            for f in start_fresh(fresh, folder):
                err_console.print(f"{f.code}: {f.message}", markup=False, soft_wrap=True)
        result_file = Path(tmp) / "result.json"
        os.environ[HOLDER_ENV] = str(os.getpid())
        os.environ[RESULT_ENV] = str(result_file)
        try:
            launched = launch(nproc, worker, max_restarts)
            status = launched.status
        finally:
            os.environ.pop(HOLDER_ENV, None)
            os.environ.pop(RESULT_ENV, None)
            remove_unused_backstops(folder)
        try:
            result = RunResult.from_dict(json.loads(result_file.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            result = RunResult.empty(folder)  # no worker got as far as its result
        result.findings += [f for f in launched.dead if f not in result.findings]
    if status != result.exit_status:  # e.g. another rank failed, or this process was stopped
        result.exit_status = status
        if status > 128:
            result.error = describe_error(Interrupted(status - 128))
        elif status != ExitStatus.OK and result.error is None:
            dead = "; ".join(f.message for f in launched.dead)
            result.error = {
                "type": "WorkerFailed",
                "message": f"a worker process exited with status {status}"
                + (f" ({dead})" if dead else ""),
                "fix": "read the workers' messages above; run the same command again to resume",
            }
    return result


def register(app: typer.Typer) -> None:
    @app.command("run", cls=_RunCommand)
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
        as_json: Annotated[
            bool, typer.Option("--json", help="Print one JSON object on every exit.")
        ] = False,
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
        oversubscribe: Annotated[
            bool,
            typer.Option(
                "--oversubscribe",
                help="With --nproc: start more processes than this machine has cores (or "
                "memory for) anyway; without it such a count is refused before anything starts.",
            ),
        ] = False,
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
        accept_data_change: Annotated[
            bool,
            typer.Option(
                "--accept-data-change",
                help="Resume although the prepared data differs from the checkpoint's (D104); "
                "without it such a resume stops with exit 1.",
            ),
        ] = False,
        force: Annotated[
            bool,
            typer.Option(
                "--force",
                help="Compare with reference.path even if it was recorded for another recipe "
                "(recipe key reference.force); the differing keys are reported (R505).",
            ),
        ] = False,
    ) -> None:
        """Prepare data, run pre-flight checks, train with verified checkpoints and auto-resume,
        evaluate, and write a report. Running it again in the same run dir resumes."""
        status = start_run(
            recipe=recipe,
            run_dir=run_dir,
            overrides=overrides,
            as_json=as_json,
            quiet=quiet,
            no_evals=no_evals,
            nproc=nproc,
            oversubscribe=oversubscribe,
            max_restarts=max_restarts,
            fresh=fresh,
            doctor=doctor,
            accept_data_change=accept_data_change,
            force=force,
        )
        raise typer.Exit(status)


def start_run(
    *,
    recipe: str,
    run_dir: Path | None,
    overrides: list[str] | None,
    as_json: bool,
    quiet: bool,
    no_evals: bool,
    nproc: int | None,
    oversubscribe: bool,
    max_restarts: int,
    fresh: bool,
    doctor: bool,
    accept_data_change: bool,
    force: bool,
) -> int:
    """`trainguard run`'s work: the recipe resolved and checked before any launch, then the
    run in this process (`run_recipe`) or `nproc` local workers under the launcher; the exit
    status (the result is printed by `_RunOutput` as the run ends)."""
    from trainguard.config.load import load_recipe, recipe_to_dict
    from trainguard.reference.select import select_reference
    from trainguard.train.guarded_run import run_recipe
    from trainguard.train.launch import check_launch_args
    from trainguard.util.processes import check_local_processes

    out = _RunOutput(as_json, quiet)
    folder = run_dir
    try:
        check_launch_args(nproc, max_restarts)  # --max-restarts -1 is wrong without --nproc too
        if doctor:
            overrides = [*(overrides or []), "preflight.doctor=true"]
        if force:
            overrides = [*(overrides or []), "reference.force=true"]
        resolved = load_recipe(recipe, overrides)  # bad recipes fail here, before any launch
        select_reference(recipe_to_dict(resolved))  # so do bad or mismatched references
        folder = run_dir or Path("runs") / resolved.name
        # The run writes metrics, checkpoints and reports into its run dir: never into the
        # corpus (which would also change the data under a resumed run). Resuming with the
        # run's own RUN_DIR/recipe.yaml as RECIPE is fine: the run writes it back unchanged.
        refuse_overwrite(
            {"--run-dir": folder},
            {
                "RECIPE": recipe if Path(recipe).is_file() else None,
                "data.source": resolved.data.source,
                "prediction.band": resolved.prediction.band,
            },
        )
        if nproc is not None:
            if resolved.train.batch_size % nproc:
                raise ConfigError(
                    f"train.batch_size={resolved.train.batch_size} is not divisible by "
                    f"--nproc {nproc}",
                    "use a process count that divides train.batch_size (the global batch "
                    "must not depend on the process count)",
                )
            check_local_processes(
                nproc,
                f"--nproc {nproc}",
                lambda n: f"use --nproc {n} or fewer (more ranks: torchrun across machines)",
                oversubscribe,
            )
            worker = ["run", recipe, "--run-dir", str(folder)]
            for o in overrides or []:
                worker += ["--set", o]
            worker += ["--json"] if as_json else []
            worker += ["--quiet"] if quiet else []
            worker += ["--no-evals"] if no_evals else []
            worker += ["--accept-data-change"] if accept_data_change else []
            fresh_recipe = resolved if fresh else None
            result = _launch_job(folder, nproc, worker, max_restarts, fresh_recipe)
            if as_json:  # else rank 0 has printed its summary, and the launcher the failure
                out.end(result)
            return result.exit_status
        run_recipe(
            resolved,
            folder,
            progress=not (quiet or as_json),
            evals=not no_evals,
            fresh=fresh,
            accept_data_change=accept_data_change,
            on_end=out.end,
        )
    except (Exception, KeyboardInterrupt) as e:
        out.end(RunResult.empty(folder).with_error(e))  # unless run_recipe has printed it
        raise
    return ExitStatus.OK
