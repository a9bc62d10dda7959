"""`trainguard drill --chaos DURATION`: the soak (drills/chaos.py), its progress, table and plot."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rich.table import Table

from trainguard.cli.common import console, emit, err_console
from trainguard.errors import BadInputError

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
) -> None:
    """Every input is checked before the first run starts (exit 2, nothing started)."""
    from trainguard.drills.chaos import run_chaos
    from trainguard.drills.chaos_plot import write_timeline
    from trainguard.drills.chaos_schedule import check_room, parse_duration, parse_kinds
    from trainguard.drills.chaos_verdict import summary, verdict
    from trainguard.drills.runner import DrillContext, DrillPlan
    from trainguard.util.atomic import check_writable
    from trainguard.util.processes import check_local_processes

    duration = parse_duration(chaos)
    chosen = parse_kinds(kinds, nproc)
    plan = DrillPlan(ctx_args.pop("steps"))
    check_room(plan.max_steps, plan.interval, faults, chosen)
    # One job at a time (the reference run, then the soak run and its relaunches): its
    # processes must fit the machine.
    check_local_processes(nproc, f"--nproc {nproc}", lambda n: f"use --nproc {n} or fewer")
    import tempfile

    from trainguard.config.load import load_recipe

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
    if plot is not None:
        check_writable(plot)
    folder = workdir or Path(tempfile.mkdtemp(prefix="tg-chaos-"))
    target = plot or folder / "chaos_timeline.png"
    ctx = DrillContext(plan=plan, workdir=folder, **ctx_args)
    say = (err_console if as_json else console).print
    say(f"chaos soak for {duration:g} s in {folder} (seed {seed}, {faults} faults a round)")
    try:
        rounds = run_chaos(ctx, duration, seed, faults, chosen, lambda m: say(m, markup=False))
        found = summary(rounds)
        written = write_timeline(rounds, target)
    finally:
        if workdir is None and not keep:  # the run dirs go; the plot stays
            for child in folder.glob("round*"):
                shutil.rmtree(child, ignore_errors=True)
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
        "settings": ctx.settings(),
    }
    emit(verdict(rounds), as_json, extra=extra, title="Chaos soak")
