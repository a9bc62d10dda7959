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


def _open_record(
    target: Path, model: str | None, tokenizer: Path | None, device: str, specs: list
) -> Any:
    """Another loop's run record: the user's model factory and tokenizer, the specs named."""
    from trainguard.checks.model_target import load_model
    from trainguard.checks.tokenizer_audit import load_tokenizer_file
    from trainguard.errors import BadInputError
    from trainguard.evals.record_target import open_record_for_eval
    from trainguard.metrics.record_read import read_record

    record = read_record(target)
    missing = [
        (flag, why)
        for flag, given, why in (
            ("--model module:function", model, "a function returning your model (nn.Module)"),
            ("--tokenizer tokenizer.json", tokenizer, "the tokenizer the evals encode text with"),
            ("--spec SPEC", specs, "the evals to run (a spec file or shipped name)"),
        )
        if not given
    ]
    if missing:
        raise BadInputError(
            f"{target} is a {record.loop} record: it has no recipe to build the model, its "
            f"tokenizer and evals from (missing {', '.join(flag for flag, _ in missing)})",
            "pass " + "; ".join(f"{flag}: {why}" for flag, why in missing),
        )
    tok = load_tokenizer_file(tokenizer)  # type: ignore[arg-type]
    return open_record_for_eval(record, load_model(model), tok, device)  # type: ignore[arg-type]


def evaluate(
    target: Path,
    spec: list[str] | None,
    max_examples: int | None,
    device: str,
    as_json: bool,
    model: str | None = None,
    tokenizer: Path | None = None,
) -> None:
    """Open the model (a `trainguard run`'s recipe, or another loop's record with the user's
    factory), run the evals and canaries, print and exit."""
    from trainguard.config.evals import EvalsConfig
    from trainguard.config.load import RECIPE_FILE
    from trainguard.evals.load import open_for_eval
    from trainguard.evals.runner import run_evals
    from trainguard.evals.spec import check_examples, load_spec
    from trainguard.metrics.record_read import is_run_record

    _check_device(device)
    # Specs named here are checked before the model loads: bad input fails at once.
    given = [load_spec(s) for s in spec or []]
    for s in given:
        check_examples(s)
    own = is_run_record(target) and not (target / RECIPE_FILE).is_file()
    if own:
        opened = _open_record(target, model, tokenizer, device, given)
    else:
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
        data=recipe.data if recipe is not None else None,
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


@eval_app.command("run")
def eval_run(
    target: Path = typer.Argument(
        ...,
        help="Run dir (newest checkpoint) or checkpoint folder; any loop's run record with "
        "--model and --tokenizer.",
    ),
    spec: list[str] = typer.Option(
        None, "--spec", help="Spec file or shipped name; repeatable. Default: the recipe's."
    ),
    max_examples: int | None = typer.Option(
        None, min=1, help="Examples per task at most (1 or more). Default: the recipe's."
    ),
    device: str = typer.Option("cpu", help="torch device."),
    model: str | None = typer.Option(
        None,
        "--model",
        help="module:function (or file.py:function) returning your model, for a run record "
        "your own loop, a GuardedTrainer or Lightning wrote; loaded with the newest verified "
        "checkpoint's weights.",
    ),
    tokenizer: Path | None = typer.Option(
        None, "--tokenizer", help="tokenizer.json for a run record without a recipe."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run the evals and canaries on a run dir or checkpoint; `eval PATH` is short for this."""
    evaluate(target, spec, max_examples, device, as_json, model, tokenizer)


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
