"""`trainguard data order-check ORDER`: how well a loader's order mixes sources (D301/D302)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console, emit
from trainguard.errors import BadInputError


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
        from trainguard.checks.order_check import (
            labels_file,
            labels_prepared,
            order_check,
            read_order,
        )

        if count < 2:
            raise BadInputError(f"--count {count} must be at least 2", "use the default 20000")
        if window is not None and window < 2:
            raise BadInputError(f"--window {window} must be at least 2", "or omit it")
        if sources is not None and prepared is not None:
            raise BadInputError(
                "--sources and --prepared both name the sources", "give one of them"
            )
        if prepared is not None and (seq_len is None or seq_len < 1):
            raise BadInputError(
                "--prepared needs --seq-len", "pass the recipe's data.seq_len, e.g. --seq-len 128"
            )
        ids, labels = read_order(order, count)
        if labels is None:
            if sources is not None:
                labels = labels_file(ids, sources)
            elif prepared is not None:
                labels = labels_prepared(ids, prepared, int(seq_len or 0))
            else:
                raise BadInputError(
                    f"the samples of {order!r} carry no source",
                    "pass --sources (line i: the source of sample i) or --prepared DIR "
                    "--seq-len N, or give ID<TAB>SOURCE lines / (id, source) pairs",
                )
        findings, stats = order_check(labels, window)
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
