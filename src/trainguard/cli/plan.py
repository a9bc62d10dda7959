"""`trainguard plan`: the checkpoint interval that maximises goodput at N GPUs (docs/goodput.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from trainguard.cli.common import console, emit
from trainguard.config.schema import SEED_MAX

_LOSS_NAMES = {
    "checkpoint_stall": "checkpoint stall",
    "lost_work": "work redone after failures",
    "restart": "restarts",
}


def _table(plan: Any, inputs: dict[str, Any], result: dict[str, Any]) -> Table:
    from trainguard.goodput.plan import FLAGS

    table = Table(title="Goodput plan", show_header=False, expand=False)
    table.add_column("", style="bold")
    table.add_column("", overflow="fold")
    k = plan.interval_steps
    source = "Young/Daly" if plan.interval_source == "young-daly" else "the model's optimum"
    table.add_row("checkpoint every", f"{k} steps ({result['interval_s']:.4g} s; {source})")
    table.add_row("expected ETTR", f"{plan.expected.ettr:.4f} at {plan.gpus} GPUs")
    sim = result["simulation"]
    if "ettr" in sim:
        lo, hi = sim["ci95"]
        off = "" if sim["agrees"] else "; outside 4 standard errors of the closed form"
        table.add_row(
            "simulated ETTR",
            f"{sim['ettr']:.4f} [{lo:.4f}, {hi:.4f}] ({sim['cycles']} failures{off})",
        )
    else:
        table.add_row("simulated ETTR", f"skipped: {sim['skipped']}")
    for name, share in plan.expected.losses.items():
        mark = "  <- dominates" if name == plan.expected.dominant else ""
        table.add_row(_LOSS_NAMES[name], f"{share:.2%}{mark}")
    table.add_row("job MTBF", f"{result['job_mtbf_hours']:.4g} h")
    if plan.current is not None:
        table.add_row(
            "the current interval",
            f"{plan.current.interval_steps} steps: ETTR {plan.current.ettr:.4f}",
        )
    for name, inp in inputs.items():
        note = f": {inp.note}" if inp.note else ""
        table.add_row(FLAGS[name], f"{inp.value:.6g} ({inp.source}{note})")
    return table


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_command(
        step_time: Annotated[
            float | None, typer.Option("--step-time", help="Seconds per training step.")
        ] = None,
        checkpoint_stall: Annotated[
            float | None,
            typer.Option("--checkpoint-stall", help="Seconds a save blocks training (its stall)."),
        ] = None,
        checkpoint_write: Annotated[
            float | None,
            typer.Option(
                "--checkpoint-write",
                help="Seconds from a save's start until the checkpoint is durable (an async "
                "save's write; default: the stall, as for a synchronous save).",
            ),
        ] = None,
        restart: Annotated[
            float | None,
            typer.Option("--restart", help="Seconds from a failure to the first resumed step."),
        ] = None,
        gpus: Annotated[
            int | None, typer.Option("--gpus", help="GPUs in the job (default: the run's).")
        ] = None,
        gpu_mtbf_hours: Annotated[
            float | None,
            typer.Option(
                "--gpu-mtbf-hours",
                help="One GPU's mean time between interruptions, in hours (default: Llama 3 "
                "405B's, 16384 * 54 * 24 / 419 = 50,677 h).",
            ),
        ] = None,
        run_dir: Annotated[
            Path | None,
            typer.Option(
                "--run",
                help="A `trainguard run` dir to measure the step time and stall from "
                "(medians; flags win).",
            ),
        ] = None,
        interval: Annotated[
            int | None,
            typer.Option(
                "--interval",
                min=1,
                help="The checkpoint interval you use now, in steps, to compare with the plan "
                "(default: the run's checkpoint.interval).",
            ),
        ] = None,
        out: Annotated[
            Path | None,
            typer.Option("--out", help="Folder for the plots (ETTR against GPUs and interval)."),
        ] = None,
        seed: Annotated[
            int, typer.Option("--seed", min=0, max=SEED_MAX, help="The simulation's seed.")
        ] = 0,
        cycles: Annotated[
            int,
            typer.Option(
                "--cycles",
                min=1000,
                max=10_000_000,
                help="Failures the simulation draws (more: a narrower interval).",
            ),
        ] = 100_000,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """The checkpoint interval that maximises goodput (the effective training time ratio,
        ETTR) at N GPUs under a per-GPU failure rate: Young/Daly's interval, checked by the
        model's exact optimum and a simulation; the expected ETTR and what the rest of the
        wall time goes to (checkpoint stalls, work redone after failures, restarts)."""
        plan, inputs, result = plan_result(
            run_dir=run_dir,
            out=out,
            flags={
                "step_time_s": step_time,
                "checkpoint_stall_s": checkpoint_stall,
                "checkpoint_write_s": checkpoint_write,
                "restart_s": restart,
                "gpus": gpus,
                "gpu_mtbf_hours": gpu_mtbf_hours,
            },
            seed=seed,
            cycles=cycles,
            interval=interval,
        )
        from trainguard.goodput.plan import plan_findings  # with the plan's own imports

        if not as_json:
            console.print(_table(plan, inputs, result))
            for p in result.get("plots", []):
                console.print(f"wrote {p}")
        emit(plan_findings(plan), as_json, extra=result, title="Goodput plan")


def plan_result(
    *,
    run_dir: Path | None,
    out: Path | None,
    flags: dict[str, Any],
    seed: int,
    cycles: int,
    interval: int | None,
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """`trainguard plan`'s work: the measured costs of `run_dir` (if any) under the explicit
    `flags`, the plan, its JSON fields and plots under `out`; (plan, inputs, result)."""
    from trainguard.goodput.measure import measure_run
    from trainguard.goodput.plan import make_plan, out_paths, resolve_inputs

    paths = out_paths(out) if out is not None else {}
    if out is not None:
        from trainguard.util.atomic import check_writable
        from trainguard.util.paths import refuse_overwrite

        refuse_overwrite({"--out": out}, {"--run": run_dir})
        check_writable(out, folder=True)
    measured = measure_run(run_dir) if run_dir is not None else None
    inputs = resolve_inputs(flags, measured.found() if measured else {}, run_dir is not None)
    plan = make_plan(
        inputs,
        seed=seed,
        cycles=cycles,
        current_steps=interval or (measured.interval_steps if measured else None),
    )
    result: dict[str, Any] = {
        **plan.to_dict(),
        "inputs": {k: v.to_dict() for k, v in inputs.items()},
        "failure_model": {
            "gpu_mtbf_hours": plan.gpu_mtbf_hours,
            "source": inputs["gpu_mtbf_hours"].note or "--gpu-mtbf-hours",
            "job_mtbf_hours": plan.mtbf_s / 3600.0,
        },
        "seed": seed,
        "run": None if run_dir is None else str(run_dir),
    }
    if paths:
        from trainguard.goodput.plot import plot_plan

        result["plots"] = [str(p) for p in plot_plan(plan, paths)]
    return plan, inputs, result
