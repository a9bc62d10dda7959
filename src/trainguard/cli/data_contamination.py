"""`trainguard data contamination TRAIN --evals SPEC...`: eval examples found in training data."""

from __future__ import annotations

from typing import Annotated

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console, emit
from trainguard.cli.data_dedup import Engine
from trainguard.errors import BadInputError


def _specs(evals: list[str]) -> list[str]:
    """`--evals a --evals b` and `--evals a,b` alike, in order, without repeats."""
    out: list[str] = []
    for item in evals:
        for name in item.split(","):
            if name.strip() and name.strip() not in out:
                out.append(name.strip())
    if not out:
        raise BadInputError(
            "no eval spec given", "pass --evals with a spec file or a shipped spec name"
        )
    return out


def check_options(
    val_fraction: float,
    ngram: int,
    containment: float,
    edit_containment: float,
    max_examples: int | None,
) -> None:
    """Bad input (exit 2) before any data is read: each option outside its range, named."""
    if not 0.0 <= val_fraction < 0.5:
        raise BadInputError(
            f"--val-fraction {val_fraction} is outside [0, 0.5)",
            "give the recipe's data.val_fraction (0.05 by default), or 0",
        )
    if ngram < 1:
        raise BadInputError(f"--ngram {ngram} must be at least 1", "use 13 (GPT-3's n)")
    if not 0.0 < containment <= 1.0:
        raise BadInputError(
            f"--containment {containment} is outside (0, 1]", "use 0.8, the default"
        )
    if not 0.0 < edit_containment <= 1.0:
        raise BadInputError(
            f"--edit-containment {edit_containment} is outside (0, 1]",
            "use 0.35, the default",
        )
    if max_examples is not None and max_examples < 1:
        raise BadInputError(f"--max-examples {max_examples} must be at least 1", "or omit it")


def register(app: typer.Typer) -> None:
    data = group(app, "data")

    @data.command("contamination")
    def data_contamination(
        train: Annotated[
            str,
            typer.Argument(
                help="Training data: 'stdlib', a folder of text files, .jsonl or .parquet."
            ),
        ],
        evals: Annotated[
            list[str],
            typer.Option(
                "--evals",
                help="Eval spec (file or shipped name); repeat, or separate with commas.",
            ),
        ],
        val_fraction: Annotated[
            float,
            typer.Option(
                help="Documents held out of training as `trainguard run` holds them out "
                "(data.val_fraction); builtin tasks are generated from them. 0: all of TRAIN "
                "is training data.",
            ),
        ] = 0.0,
        text_field: Annotated[str, typer.Option(help="Text field of JSONL/Parquet.")] = "text",
        max_examples: Annotated[
            int | None, typer.Option(help="Examples per task at most (the first ones).")
        ] = None,
        ngram: Annotated[int, typer.Option(help="Words per n-gram (GPT-3: 13).")] = 13,
        containment: Annotated[
            float,
            typer.Option(help="MinHash containment in one training document that counts."),
        ] = 0.8,
        edit_containment: Annotated[
            float,
            typer.Option(
                help="Exact share of an example's word 5-grams in one training document that "
                "counts as an edited copy (0.35: a word in ten changed keeps about half)."
            ),
        ] = 0.35,
        engine: Annotated[
            Engine, typer.Option(help="Where to scan TRAIN; spark gives the same report.")
        ] = Engine.local,
        spark_master: Annotated[
            str | None,
            typer.Option(help="Spark master URL. Default: $SPARK_MASTER, else local[*]."),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Eval examples whose 13-grams, MinHash near-copies or edited copies are in the
        training data."""
        from trainguard.evals.contamination import check_contamination

        check_options(val_fraction, ngram, containment, edit_containment, max_examples)
        report = check_contamination(
            _specs(evals),
            train,
            text_field=text_field,
            val_fraction=val_fraction,
            max_examples=max_examples,
            ngram=ngram,
            containment=containment,
            edit_containment=edit_containment,
            engine=engine.value,
            master=spark_master,
        )
        if not as_json:
            for t in report.tasks:
                console.print(
                    f"{t.spec} / {t.task}: {len(t.contaminated)} of {t.examples} examples "
                    f"contaminated ({t.fraction:.1%})"
                )
            console.print(
                f"{report.documents} training documents scanned in {report.seconds:.1f} s"
            )
        emit(report.findings(), as_json, extra=report.to_dict(), title="data contamination")
