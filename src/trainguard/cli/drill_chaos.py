"""`trainguard drill --chaos DURATION`: the soak (drills/chaos.py), its progress, table and plot."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from trainguard.cli.common import console, emit, err_console
from trainguard.errors import BadInputError

Say = Callable[[str], None]

# As the multi-process drills run (drills/multiproc_scenarios.py): a 30 s watchdog floor (the
# ranks wait in their first all-reduce for the slowest one), collectives that time out in 8 s
# and name the missing rank after 4, the straggler check every 2 steps.
MULTIPROC_SETTINGS = (
    "guards.hang_floor_s=30",
    "distributed.collective_timeout_s=8",
    "distributed.hang_timeout_s=4",
    "distributed.straggler_interval=2",
)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _table(rounds: list[Any], summary: dict[str, Any]) -> Table:
    table = Table(title="Chaos soak: per fault kind")
    for col in ("fault", "count", "detected", "detection", "recovery (s)", "steps lost"):
        table.add_column(col)
    for kind, k in summary["kinds"].items():
        detect = _s(k["median_detect_s"]) + " s"
        if k["median_detect_steps"] is not None:
            detect = f"{k['median_detect_steps']:g} steps"
        table.add_row(
            kind,
            str(k["count"]),
            f"{k['detected']}/{k['count']}",
            detect,
            _s(k["median_recovery_s"]),
            str(k["steps_lost"]),
        )
    return table


def _run_launcher(
    kinds: list[str] | None, faults: int, nproc: int, ctx_args: dict[str, Any]
) -> tuple[tuple[str, ...], Callable[[Path, Say], Any]]:
    """The soak of `trainguard run`: its fault kinds, and how to make its launcher."""
    from trainguard.config.load import load_recipe
    from trainguard.drills.chaos import RunLauncher
    from trainguard.drills.chaos_schedule import check_room, parse_kinds
    from trainguard.drills.runner import DrillContext, DrillPlan
    from trainguard.util.processes import check_local_processes

    chosen = parse_kinds(kinds, nproc)
    plan = DrillPlan(ctx_args.pop("steps"))
    check_room(plan.max_steps, plan.interval, faults, chosen)
    # One job at a time (the reference run, then the soak run and its relaunches): its
    # processes must fit the machine.
    check_local_processes(nproc, f"--nproc {nproc}", lambda n: f"use --nproc {n} or fewer")
    if nproc > 1:  # the multi-process drills' settings; the user's --set come after and win
        ctx_args["overrides"] = [*MULTIPROC_SETTINGS, *ctx_args["overrides"]]
        ctx_args["run_args"] = ("--no-evals", "--nproc", str(nproc), "--oversubscribe")
    probe = DrillContext(plan=plan, workdir=Path("."), **ctx_args)
    recipe = load_recipe(probe.recipe, probe.settings())  # bad recipe or --set: exit 2
    if recipe.train.batch_size % nproc:
        raise BadInputError(
            f"--nproc {nproc} does not divide train.batch_size={recipe.train.batch_size}",
            "use a process count that divides the batch size, or --set train.batch_size",
        )
    return chosen, lambda folder, _: RunLauncher(
        DrillContext(plan=plan, workdir=folder, **ctx_args)
    )


def _command_launcher(
    command: str, kinds: list[str] | None, nproc: int, ctx_args: dict[str, Any]
) -> tuple[tuple[str, ...], Callable[[Path, Say], Any]]:
    """The soak of a user's command (drills/chaos_external.py)."""
    from trainguard.drills.chaos_command import command_kinds, command_nproc, parse_command
    from trainguard.drills.chaos_external import CommandLauncher
    from trainguard.util.processes import check_local_processes

    mine = {
        "--recipe": ctx_args["recipe"] != "default",
        "--set": bool(ctx_args["overrides"]),
        "--steps": ctx_args["steps"] != 60,
        "--nproc": nproc != 1,
    }
    if any(mine.values()):
        raise BadInputError(
            f"{', '.join(k for k, v in mine.items() if v)}: for a soak of `trainguard run`, "
            "not of --command",
            "drop them: the command decides its recipe, steps and processes (torchrun "
            "--nproc-per-node N), and the soak reads the run's length and checkpoint interval "
            "from a fault-free run of it",
        )
    argv = parse_command(command)
    chosen = command_kinds(kinds, argv)
    n = command_nproc(argv) or 1
    check_local_processes(n, f"--nproc-per-node {n}", lambda k: f"use --nproc-per-node {k}")
    return chosen, lambda folder, say: CommandLauncher(argv, folder, chosen, say)


def run_chaos_command(
    *,
    chaos: str,
    seed: int,
    faults: int,
    kinds: list[str] | None,
    nproc: int,
    ctx_args: dict[str, Any],
    workdir: Path | None,
    keep: bool,
    plot: Path | None,
    as_json: bool,
    command: str | None = None,
) -> None:
    """Every input is checked before the first run starts (exit 2, nothing started); with
    `command`, what only its fault-free reference run can say (its length and checkpoint
    interval, its world size) right after that run."""
    import tempfile

    from trainguard.drills.chaos import run_chaos
    from trainguard.drills.chaos_plot import write_timeline
    from trainguard.drills.chaos_schedule import parse_duration
    from trainguard.drills.chaos_verdict import summary, verdict
    from trainguard.util.atomic import check_writable

    duration = parse_duration(chaos)
    if command is not None:
        chosen, make = _command_launcher(command, kinds, nproc, ctx_args)
    else:
        chosen, make = _run_launcher(kinds, faults, nproc, ctx_args)
    if plot is not None:
        check_writable(plot)
    folder = workdir or Path(tempfile.mkdtemp(prefix="tg-chaos-"))
    target = plot or folder / "chaos_timeline.png"
    show = (err_console if as_json else console).print

    def say(message: str) -> None:
        show(message, markup=False)

    launcher = make(folder, say)  # a --workdir with an earlier soak's runs: refused here
    say(f"chaos soak for {duration:g} s in {folder} (seed {seed}, {faults} faults a round)")
    try:
        rounds = run_chaos(launcher, duration, seed, faults, chosen, say)
        found = summary(rounds)
        written = write_timeline(rounds, target)
    finally:
        if workdir is None and not keep:  # the run dirs go; the plot stays
            for child in [*folder.glob("round*"), *folder.glob("reference*")]:
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
    if not as_json:
        console.print(_table(rounds, found))
        share = found["goodput"]
        console.print(
            f"goodput {share:.1%} of {found['wall_s']:.1f} s" if share is not None else "",
            markup=False,
        )
        for r in rounds:
            equal = {True: "equal", False: "DIFFERENT", None: "not compared"}[r.bitwise_equal]
            console.print(
                f"round {r.number}: final step {r.final_step}, weights {equal} to the reference",
                markup=False,
            )
        console.print(f"wrote {written}", markup=False)
    extra = {
        "seed": seed,
        "duration_s": duration,
        "kinds": list(chosen),
        "summary": found,
        "rounds": [r.to_dict() for r in rounds],
        "plot": str(written),
        "workdir": str(folder) if (workdir is not None or keep) else None,
        "settings": launcher.settings(),
    }
    emit(verdict(rounds), as_json, extra=extra, title="Chaos soak")
