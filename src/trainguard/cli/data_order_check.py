"""`trainguard data order-check ORDER`: how well a loader's order mixes sources (D301/D302)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console, emit


def register(app: typer.Typer) -> None:
    data = group(app, "data")

    @data.command("order-check")
    def data_order_check(
        order: Annotated[
            str,
            typer.Argument(
                help="A file of sample ids (one per line, or ID<TAB>SOURCE), or a Python "
                "sampler as module:factory (returns an iterable of ids or (id, source) pairs)."
            ),
        ],
        sources: Annotated[
            Path | None,
            typer.Option(help="Labels file for integer ids: line i is the source of sample i."),
        ] = None,
        prepared: Annotated[
            Path | None,
            typer.Option(help="A `data prepare` folder: ids are samples of its train split."),
        ] = None,
        seq_len: Annotated[
            int | None, typer.Option(help="Tokens per sample of --prepared.")
        ] = None,
        count: Annotated[int, typer.Option(help="Samples read from the order at most.")] = 20_000,
        window: Annotated[
            int | None,
            typer.Option(help="Samples per window (default: min(256, samples / 20))."),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Check a loader's order before training: does it mix sources like a random order?"""
        from trainguard.checks.order_check import check_order

        findings, stats = check_order(order, count, window, sources, prepared, seq_len)
        if not as_json:
            ratio = stats.get("mean_chi2_ratio")
            console.print(
                f"{stats['samples']} samples from {stats['sources']} sources"
                + (
                    f": windows mix {ratio:.2f}x a random order's spread"
                    if ratio is not None
                    else ""
                )
            )
        emit(findings, as_json, extra={"order": order, **stats}, title="data order-check")
