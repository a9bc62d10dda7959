"""`trainguard doctor [RECIPE] [--set KEY=VALUE ...] [--nproc N] [--json] [--quick]
[--inject KIND/rR ...] [--repeat N]`: find the bad rank before (or after) it costs a run.

Three ways to run, one code path for the ranks:
- one process (no --nproc, no torchrun): this process tests itself;
- `--nproc N`: N local processes through the project's launcher (train/launch.py); rank 0
  writes its report to a file this process reads, renders and turns into the exit status;
- under an external `torchrun` (several nodes): every rank runs this command, rank 0 prints
  the report and exits 0 or 1, the other ranks exit 0.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from trainguard.cli.common import console, emit, err_console
from trainguard.errors import ExitStatus
from trainguard.util.paths import is_remote

# Set by `--nproc` for its workers: where rank 0 writes the report.
RESULT_ENV = "TRAINGUARD_DOCTOR_RESULT"
_FIGURES = (
    ("matmul_gflops", "matmul GFLOP/s", "{:.1f}"),
    ("attention_ms", "attention ms", "{:.2f}"),
    ("burn_gflops", "burn GFLOP/s", "{:.1f}"),
    ("host_memory_gbps", "host mem GB/s", "{:.2f}"),
    ("device_memory_gbps", "device mem GB/s", "{:.1f}"),
    ("storage_write_mbps", "write MB/s", "{:.0f}"),
    ("storage_read_mbps", "read MB/s", "{:.0f}"),
)


def _check_storage_url(plan: Any) -> None:
    """A URL whose fsspec backend is missing is bad input (exit 2), found before launching.
    Reachability is the doctor's job (a finding), not the command line's."""
    if is_remote(plan.checkpoint_dir):
        from trainguard.util.fsurl import open_filesystem

        open_filesystem(plan.checkpoint_dir, plan.storage_options)


def _worker_args(recipe: str, overrides: list[str], quick: bool, inject: list[str], repeat: int):
    args = ["doctor", recipe]
    for o in overrides:
        args += ["--set", o]
    for i in inject:
        args += ["--inject", i]
    return [*args, *(["--quick"] if quick else []), "--repeat", str(repeat)]


def _rank_table(round_: dict[str, Any]) -> Table:
    title = f"Doctor round {round_['round']} (inject {round_['inject']}, {round_['seconds']:.1f}s)"
    table = Table(title=title)
    present = [k for k, _, _ in _FIGURES if any(k in r for r in round_["ranks"])]
    for col in ("rank", "host", "device", *(h for k, h, _ in _FIGURES if k in present)):
        table.add_column(col, overflow="fold")
    for r in round_["ranks"]:
        if r.get("answered") is False:
            cells = ["no answer"] * len(present)
        else:
            cells = [fmt.format(r[k]) if k in r else "-" for k, _, fmt in _FIGURES if k in present]
        table.add_row(str(r["rank"]), r["host"], r["device"], *cells)
    return table


def _bandwidth_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="Collectives (slowest rank)")
    for col in ("op", "size", "ms", "algbw GB/s", "busbw GB/s"):
        table.add_column(col)
    for r in rows:
        size = f"{r['bytes'] / (1 << 20):.2f} MiB"
        table.add_row(
            r["op"],
            size,
            f"{r['seconds'] * 1e3:.2f}",
            f"{r['algbw_gbps']:.2f}",
            f"{r['busbw_gbps']:.2f}",
        )
    return table


def _show(payload: dict[str, Any]) -> None:
    for round_ in payload["rounds"]:
        console.print(_rank_table(round_))
        if round_["bandwidth"]:
            console.print(_bandwidth_table(round_["bandwidth"]))


def _report(payload: dict[str, Any], findings: list, as_json: bool) -> None:
    from trainguard.findings import Finding

    found = [f if isinstance(f, Finding) else Finding.from_dict(f) for f in findings]
    if not as_json:
        _show(payload)
    emit(found, as_json, extra=payload, title="Doctor")


def _launch(nproc: int, worker: list[str], as_json: bool) -> None:
    from trainguard.findings import Finding
    from trainguard.train.launch import launch
    from trainguard.util.processes import available_cores

    cores = available_cores()
    if nproc > cores:  # only with --oversubscribe (checked before)
        err_console.print(
            f"[yellow]warning:[/] --nproc {nproc} on {cores} core(s): the processes share "
            "cores, so timings mean less (H417); running anyway (--oversubscribe)",
            markup=True,
        )
    with tempfile.TemporaryDirectory(prefix="tg-doctor-") as tmp:
        result = Path(tmp) / "report.json"
        os.environ[RESULT_ENV] = str(result)
        try:
            launched = launch(nproc, worker)
        finally:
            os.environ.pop(RESULT_ENV, None)
        payload = json.loads(result.read_text(encoding="utf-8")) if result.exists() else None
    status = launched.status
    if payload is None:
        if status == ExitStatus.BAD_INPUT:  # the workers said why on stderr
            raise typer.Exit(ExitStatus.BAD_INPUT)
        lost = Finding.of(
            "H429", f"the {nproc} doctor processes exited with status {status} and no report"
        )
        # A worker that died is named (R302: rank, signal or status), not only "no report".
        extra = {"world_size": nproc, "rounds": []}
        emit([*launched.dead, lost], as_json, extra=extra, title="Doctor")
    _report(payload, [*launched.dead, *payload.pop("findings")], as_json)


def _as_rank(recipe: Any, plan: Any, rounds: list, as_json: bool) -> None:
    """This process is one rank (alone, or one of a torchrun job)."""
    from trainguard.doctor import Team, run_doctor
    from trainguard.train.world import env_world_size, init_distributed

    size = env_world_size()
    # The doctor has no batch: the world size itself passes init_distributed's divisibility.
    dist = init_distributed(recipe.distributed, batch_size=max(size, 1))
    team = Team.from_dist(dist)
    report = run_doctor(team, plan, rounds)
    if not report.hung:
        dist.close()  # with a rank gone, rank 0 just exits (the launcher ends the rest)
    if team.rank != 0:
        raise typer.Exit(ExitStatus.OK)  # rank 0 speaks for the job
    payload = report.to_dict()
    target = os.environ.get(RESULT_ENV)
    if target:  # under `--nproc`: the launching process renders
        Path(target).write_text(
            json.dumps({**payload, "findings": [f.to_dict() for f in report.findings]}),
            encoding="utf-8",
        )
        # A hung rank still runs: a failed rank 0 makes the launcher stop it. Status 3, a
        # hang's survivor (as a run's): the launcher names a worker that exits otherwise as
        # dead (R302), which this one is not. The command's own status comes from the report.
        raise typer.Exit(ExitStatus.HANG if report.hung else ExitStatus.OK)
    _report(payload, report.findings, as_json)


def prepare_doctor(
    recipe: str,
    overrides: list[str] | None,
    nproc: int | None,
    quick: bool,
    inject: list[str],
    repeat: int,
    *,
    oversubscribe: bool = False,
) -> tuple[Any, Any, list]:
    """(the recipe, the doctor's plan, the rounds) for `trainguard doctor`: bad input (a
    recipe, --nproc, --inject, a checkpoint URL without its fsspec backend) is exit 2 before
    any process starts."""
    from trainguard.config.load import load_recipe
    from trainguard.doctor import parse_rounds, plan_for
    from trainguard.train.world import env_world_size

    resolved = load_recipe(recipe, overrides)
    if nproc is not None:
        from trainguard.train.launch import launch_argv
        from trainguard.util.processes import check_local_processes

        launch_argv(nproc, [])  # --nproc 0: bad input before anything else
        check_local_processes(
            nproc,
            f"--nproc {nproc}",
            lambda n: (
                f"use --nproc {n} or fewer (more ranks: run the doctor under torchrun "
                "across machines)"
            ),
            oversubscribe,
        )
    world = nproc if nproc is not None else env_world_size()
    rounds = parse_rounds(inject * repeat if inject else ["none"] * repeat, world)
    plan = plan_for(resolved, quick)
    _check_storage_url(plan)
    return resolved, plan, rounds


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_command(
        recipe: Annotated[
            str,
            typer.Argument(
                help="A shipped recipe name or a YAML path (dtype, backend, "
                "checkpoint.dir and timeouts come from it)."
            ),
        ] = "default",
        overrides: Annotated[
            list[str] | None,
            typer.Option("--set", help="Override a recipe key, e.g. --set train.precision=bf16."),
        ] = None,
        nproc: Annotated[
            int | None,
            typer.Option(
                "--nproc",
                help="Test N local processes (ranks) through torch.distributed's launcher. For "
                "several machines run `trainguard doctor` under torchrun instead.",
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
        quick: Annotated[
            bool,
            typer.Option("--quick", help="Small sizes and a short burn (seconds, not a minute)."),
        ] = False,
        inject: Annotated[
            list[str] | None,
            typer.Option(
                "--inject",
                help="Plant a fault to prove it is found: bitflip/rR, slow/rR, "
                "bad-allreduce/rR, hang/rR (R >= 1), or none. Repeat for one round each, in "
                "one process group (a hang runs last).",
            ),
        ] = None,
        repeat: Annotated[
            int,
            typer.Option("--repeat", min=1, help="Run every round this many times (one job)."),
        ] = 1,
        oversubscribe: Annotated[
            bool,
            typer.Option(
                "--oversubscribe",
                help="With --nproc: start more processes than this machine has cores (or "
                "memory for) anyway (timings then mean less); without it such a count is "
                "refused before anything starts.",
            ),
        ] = False,
    ) -> None:
        """Every rank tests itself against known answers (compute, memory, collectives,
        storage, environment, GPU health) and rank 0 names the ranks that are wrong, slow or
        missing. Exit 0 healthy, 1 a rank is bad (hung included), 2 bad input."""
        values = list(inject or [])
        resolved, plan, rounds = prepare_doctor(
            recipe, overrides, nproc, quick, values, repeat, oversubscribe=oversubscribe
        )
        if nproc is not None:
            _launch(
                nproc, _worker_args(recipe, list(overrides or []), quick, values, repeat), as_json
            )
        else:
            _as_rank(resolved, plan, rounds, as_json)
