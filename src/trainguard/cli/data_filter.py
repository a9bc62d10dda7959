"""`trainguard data filter IN --out OUT [--engine local|spark]`: keep documents that pass the
quality rules."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console, emit
from trainguard.cli.data_dedup import Engine
from trainguard.data.corpus import ACCEPTED
from trainguard.errors import BadInputError

if TYPE_CHECKING:
    from trainguard.filters import FilterConfig


def filter_config(min_words: int | None, max_words: int | None) -> FilterConfig:
    """The Gopher defaults with the length bounds the user overrode."""
    from trainguard.filters import FilterConfig

    cfg = FilterConfig()
    if min_words is not None:
        cfg.min_words = min_words
    if max_words is not None:
        cfg.max_words = max_words
    if cfg.min_words < 0 or cfg.max_words < cfg.min_words:
        raise BadInputError(
            f"word bounds --min-words {cfg.min_words} --max-words {cfg.max_words} are not a "
            "range (the lower bound must be at least 0 and at most the upper one)",
            "give 0 <= --min-words <= --max-words, e.g. --min-words 50 --max-words 100000",
        )
    return cfg


def check_disabled(disable: list[str]) -> list[str]:
    """`disable` if every entry names a rule; else a BadInputError listing the known ones."""
    from trainguard.filters import select_rules

    try:
        select_rules(disable)
    except ValueError as e:
        raise BadInputError(str(e), "pass --disable with a listed code or rule name") from None
    return disable


def register(app: typer.Typer) -> None:
    data = group(app, "data")

    @data.command("filter")
    def data_filter(
        source: Annotated[str, typer.Argument(help=f"{ACCEPTED}.")],
        out: Annotated[
            Path,
            typer.Option(
                "--out",
                help="Kept documents: a .jsonl/.parquet file (rejected ones go to "
                "<stem>.rejected<suffix>), or a folder for kept.<ext> and rejected.<ext>.",
            ),
        ],
        text_field: Annotated[str, typer.Option(help="Field holding the text.")] = "text",
        disable: Annotated[
            list[str] | None,
            typer.Option(help="Turn off a rule by code (D213) or name (symbol_ratio); repeat."),
        ] = None,
        min_words: Annotated[
            int | None, typer.Option(help="Lower word bound (Gopher: 50).")
        ] = None,
        max_words: Annotated[
            int | None, typer.Option(help="Upper word bound (Gopher: 100000).")
        ] = None,
        engine: Annotated[
            Engine,
            typer.Option(
                help="Where to run; spark writes folders of part files with the same records."
            ),
        ] = Engine.local,
        spark_master: Annotated[
            str | None,
            typer.Option(help="Spark master URL. Default: $SPARK_MASTER, else local[*]."),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Apply the documented quality rules (Gopher-style) and write kept and rejected docs."""
        config = filter_config(min_words, max_words)
        disabled = check_disabled(disable or [])
        if engine is Engine.spark:
            from trainguard.filters.spark import filter_source_spark

            summary = filter_source_spark(
                source, out, text_field, config, disabled, master=spark_master
            )
        else:
            from trainguard.filters.filtering import filter_source

            summary = filter_source(
                source, out, text_field=text_field, config=config, disabled=disabled
            )
        if not as_json:
            console.print(
                f"kept {summary.kept} of {summary.total} documents -> {summary.kept_path}; "
                f"rejected {summary.rejected} -> {summary.rejected_path}"
            )
        emit(summary.findings(), as_json, extra=summary.to_dict(), title="data filter")
