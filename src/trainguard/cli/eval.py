"""`trainguard eval RUN_DIR|CHECKPOINT [--spec FILE]` and `trainguard eval lint SPEC`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import typer
from typer.core import TyperGroup

from trainguard.cli.common import emit


class _DefaultToRun(TyperGroup):
    """`eval PATH ...` means `eval run PATH ...`; `eval lint SPEC` stays a subcommand.

    A group callback cannot take a positional argument without swallowing the subcommand
    name, so a first argument that names no subcommand is routed to `run`.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


eval_app = typer.Typer(
    cls=_DefaultToRun,
    no_args_is_help=True,
    help="Run eval specs on a run or checkpoint (`eval RUN_DIR|CHECKPOINT`), or lint a spec "
    "(`eval lint SPEC`).",
)


def _check_device(device: str) -> None:
    """BadInputError unless `device` names a torch device this machine has."""
    import torch

    from trainguard.errors import BadInputError

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise BadInputError(
            f"--device {device!r} is not a torch device ({e})",
            "use cpu, cuda, cuda:N or mps",
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BadInputError(f"--device {device}: no CUDA device is available", "use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise BadInputError(
            f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)",
            "use an index below that, or --device cpu",
        )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise BadInputError(f"--device {device}: MPS is not available", "use --device cpu")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise BadInputError(
            f"--device {device}: evaluation runs on cpu, cuda or mps", "use one of those"
        )


@eval_app.command("run")
def eval_run(
    target: Path = typer.Argument(..., help="Run dir (newest checkpoint) or checkpoint folder."),
    spec: list[str] = typer.Option(
        None, "--spec", help="Spec file or shipped name; repeatable. Default: the recipe's."
    ),
    max_examples: int | None = typer.Option(
        None, min=1, help="Examples per task at most (1 or more). Default: the recipe's."
    ),
    device: str = typer.Option("cpu", help="torch device."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run the evals and canaries on a run dir or checkpoint; `eval PATH` is short for this."""
    from trainguard.config.evals import EvalsConfig
    from trainguard.evals.load import open_for_eval
    from trainguard.evals.runner import run_evals
    from trainguard.evals.spec import check_examples, load_spec

    _check_device(device)
    # Specs named here are checked before the model loads: bad input fails at once.
    given = [load_spec(s) for s in spec or []]
    for s in given:
        check_examples(s)
    opened = open_for_eval(target, device=device)
    if opened.model is None:  # every candidate failed verification: the findings say why
        emit(opened.findings, as_json, extra={"checkpoint": None}, title="Evals")
    recipe = opened.recipe
    evals_cfg = getattr(recipe, "evals", None) or EvalsConfig()
    specs = given or list(evals_cfg.specs)
    limit = max_examples if max_examples is not None else evals_cfg.max_examples
    res = run_evals(
        opened.model,
        opened.tokenizer,
        specs,
        device=device,
        max_examples=limit,
        data=recipe.data,
        canaries=evals_cfg.canaries,
    )
    extra: dict[str, Any] = {
        "checkpoint": str(opened.checkpoint),
        "metrics": res.metrics,
        "examples": res.examples,
        "seconds": round(res.seconds, 3),
    }
    if not as_json:
        from trainguard.cli.common import console

        for k, v in sorted(res.metrics.items()):
            console.print(f"{k:40s} {v:.4f}")
    emit(opened.findings + res.findings, as_json, extra=extra, title="Evals")


@eval_app.command("lint")
def eval_lint(
    spec: str = typer.Argument(..., help="Spec file or shipped name."),
    tokenizer: Path | None = typer.Option(
        None, "--tokenizer", help="tokenizer.json of the recipe (token-level checks need it)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Lint an eval spec: trailing-space trap, token boundaries, BOS, choices, gold index."""
    from trainguard.evals.lint import lint_spec

    tok = None
    if tokenizer is not None:
        from trainguard.checks.tokenizer_audit import load_tokenizer_file

        tok = load_tokenizer_file(tokenizer)
    findings = lint_spec(spec, tok)
    emit(findings, as_json, extra={"spec": spec}, title="Eval lint")


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
