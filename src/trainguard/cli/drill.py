"""`trainguard drill`: inject each fault into a real run and print what was caught."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli.common import console, emit
from trainguard.errors import BadInputError
from trainguard.util.atomic import atomic_write_text, check_writable
from trainguard.util.paths import refuse_overwrite


def register(app: typer.Typer) -> None:
    @app.command("drill")
    def drill_command(
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
        only: Annotated[
            list[str] | None,
            typer.Option(
                "--only",
                help="Run only this drill (repeatable): nan, spike, kill_step, kill_checkpoint, "
                "corrupt_checkpoint, hang, bitflip, bitflip_exponent, shuffle, precision; "
                "multi-process: replica, "
                "straggler, hung_rank; doctor: doctor_bitflip, doctor_slow, "
                "doctor_bad_allreduce, doctor_hang; reference curves: reference_rerun, "
                "reference_attention, reference_init, reference_tokenizer, "
                "reference_schedule. The clean run always runs.",
            ),
        ] = None,
        workdir: Annotated[
            Path | None,
            typer.Option("--workdir", help="Where the drill runs live. Default: a temp folder."),
        ] = None,
        keep: Annotated[
            bool, typer.Option("--keep", help="Keep the run dirs (always kept with --workdir).")
        ] = False,
        recipe: Annotated[
            str, typer.Option("--recipe", help="Recipe name or YAML path to drill.")
        ] = "default",
        overrides: Annotated[
            list[str] | None,
            typer.Option("--set", help="Override a recipe key after the drill settings."),
        ] = None,
        steps: Annotated[
            int, typer.Option("--steps", min=30, help="Steps of each drill run.")
        ] = 60,
        jobs: Annotated[int, typer.Option("--jobs", min=1, help="Drills run side by side.")] = 1,
        oversubscribe: Annotated[
            bool,
            typer.Option(
                "--oversubscribe",
                help="Run more processes at once than this machine has cores (or memory "
                "for): --jobs times the largest drill's processes (3 for `replica`). Without "
                "it such a count is refused before any drill starts.",
            ),
        ] = False,
        markdown: Annotated[
            Path | None, typer.Option("--markdown", help="Also write the matrix as markdown.")
        ] = None,
        chaos: Annotated[
            str | None,
            typer.Option(
                "--chaos",
                help="A soak of DURATION (90s, 10m, 2h): rounds of one run under seeded random "
                "faults, relaunched after each, compared with a run without them "
                "(docs/drills.md, Chaos soak).",
            ),
        ] = None,
        seed: Annotated[
            int, typer.Option("--seed", min=0, help="--chaos: the fault schedule's seed.")
        ] = 0,
        faults: Annotated[
            int, typer.Option("--faults", min=1, help="--chaos: faults in each round.")
        ] = 3,
        fault_kind: Annotated[
            list[str] | None,
            typer.Option(
                "--fault-kind",
                help="--chaos: the kinds to draw from (repeatable or comma-separated): kill, "
                "corrupt, hang, nan; with --nproc 2 or more also rank_kill, hung_rank, "
                "slow_rank. Default: all (with several processes: all but hang).",
            ),
        ] = None,
        nproc: Annotated[
            int,
            typer.Option(
                "--nproc",
                min=1,
                help="--chaos: processes of the job (`run --nproc`); 2 or more adds the faults "
                "of one rank: rank_kill, hung_rank, slow_rank.",
            ),
        ] = 1,
        plot: Annotated[
            Path | None,
            typer.Option(
                "--plot", help="--chaos: the timeline PNG (default: WORKDIR/chaos_timeline.png)."
            ),
        ] = None,
        command: Annotated[
            str | None,
            typer.Option(
                "--command",
                help="--chaos: soak this command instead of `trainguard run` (a torchrun of a "
                "loop on the public parts); {run_dir} is each run's folder. Faults from "
                "outside: kill, corrupt, rank_kill, hung_rank, slow_rank.",
            ),
        ] = None,
    ) -> None:
        """Fire drills: a clean run and one run per fault (NaN batch, loss spike, SIGKILL
        mid-step and mid-checkpoint, corrupted checkpoint, hang, bit flips in a weight's
        exponent and (the blind spot of one process) its low mantissa, poor shuffle,
        low-precision reduction; with --nproc jobs: a corrupted replica, a straggler, a hung
        rank; `trainguard doctor` jobs with a wrong result, a slow rank, a wrong all-reduce
        contribution, a rank that never joins; subtle software changes against a reference curve),
        each checked for detection and recovery.
        Exit 0 when every fault was detected and recovered, the blind spot behaved as
        documented, and the clean run stayed quiet."""
        drill(
            as_json=as_json,
            only=only,
            workdir=workdir,
            keep=keep,
            recipe=recipe,
            overrides=overrides,
            steps=steps,
            jobs=jobs,
            oversubscribe=oversubscribe,
            markdown=markdown,
            chaos=chaos,
            seed=seed,
            faults=faults,
            fault_kind=fault_kind,
            nproc=nproc,
            plot=plot,
            command=command,
        )


def drill(
    *,
    as_json: bool,
    only: list[str] | None,
    workdir: Path | None,
    keep: bool,
    recipe: str,
    overrides: list[str] | None,
    steps: int,
    jobs: int,
    oversubscribe: bool,
    markdown: Path | None,
    chaos: str | None,
    seed: int,
    faults: int,
    fault_kind: list[str] | None,
    nproc: int,
    plot: Path | None,
    command: str | None = None,
) -> None:
    """`trainguard drill`: the drill matrix, or with `chaos` a soak (`cli/drill_chaos.py`);
    prints the matrix and exits through `emit` (0: every fault detected and recovered)."""
    from trainguard.drills.matrix import matrix_markdown, matrix_table, verdict
    from trainguard.drills.runner import DrillContext, DrillPlan, cleanup
    from trainguard.drills.scenarios import run_drills

    recipe_file = recipe if Path(recipe).is_file() else None
    refuse_overwrite(
        {"--markdown": markdown, "--workdir": workdir, "--plot": plot},
        {"--recipe": recipe_file},
    )
    if chaos is not None:
        from trainguard.cli.drill_chaos import run_chaos_command

        if only or markdown is not None or jobs != 1:
            raise BadInputError(
                "--only, --markdown and --jobs are for the drill matrix, not --chaos",
                "drop them: a chaos soak runs one process at a time and draws its faults "
                "(--fault-kind, --faults, --seed)",
            )
        run_chaos_command(
            chaos=chaos,
            seed=seed,
            faults=faults,
            kinds=fault_kind,
            nproc=nproc,
            ctx_args={"recipe": recipe, "overrides": list(overrides or []), "steps": steps},
            command=command,
            workdir=workdir,
            keep=keep,
            plot=plot,
            as_json=as_json,
        )
    if plot is not None or fault_kind or seed or faults != 3 or nproc != 1 or command is not None:
        raise BadInputError(
            "--plot, --fault-kind, --faults, --seed, --nproc and --command are for --chaos",
            "add --chaos DURATION for a soak, or drop them",
        )
    if markdown is not None:
        check_writable(markdown)  # now, not after an hour of drills
    folder = workdir or Path(tempfile.mkdtemp(prefix="tg-drill-"))
    ctx = DrillContext(
        recipe=recipe, overrides=list(overrides or []), plan=DrillPlan(steps), workdir=folder
    )
    if not as_json:
        console.print(f"running drills in {folder} (each is a real training run)...")
    try:
        rows = run_drills(ctx, list(only) if only else None, jobs, oversubscribe)
    finally:
        if workdir is None and not keep:
            cleanup(ctx)
    findings = verdict(rows)
    if markdown is not None:
        atomic_write_text(markdown, matrix_markdown(rows))
    if not as_json:
        console.print(matrix_table(rows))
    extra = {
        "rows": [r.to_dict() for r in rows],
        "workdir": str(folder) if (workdir is not None or keep) else None,
        "settings": ctx.settings(),
    }
    emit(findings, as_json, extra=extra, title="Fire drills")
