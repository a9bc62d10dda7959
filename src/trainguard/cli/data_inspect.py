"""`trainguard data inspect SOURCE`: look at random samples with what each rule flags."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console, emit
from trainguard.cli.data_filter import check_disabled, filter_config
from trainguard.config.schema import SEED_MAX
from trainguard.data.corpus import ACCEPTED
from trainguard.util.atomic import atomic_write_text, check_writable
from trainguard.util.paths import refuse_overwrite

if TYPE_CHECKING:
    from trainguard.filters.inspection import Inspection


def register(app: typer.Typer) -> None:
    data = group(app, "data")

    @data.command("inspect")
    def data_inspect(
        source: Annotated[str, typer.Argument(help=f"{ACCEPTED}.")],
        n: Annotated[int, typer.Option("--n", min=0, help="Documents to sample.")] = 20,
        seed: Annotated[
            int, typer.Option(min=0, max=SEED_MAX, help="Seed of the random draw.")
        ] = 0,
        html: Annotated[
            Path | None, typer.Option("--html", help="Also write a self-contained HTML page.")
        ] = None,
        text_field: Annotated[str, typer.Option(help="Field holding the text.")] = "text",
        disable: Annotated[
            list[str] | None, typer.Option(help="Turn off a rule by code or name; repeat.")
        ] = None,
        only_flagged: Annotated[
            bool, typer.Option(help="Sample only documents some rule flags.")
        ] = False,
        max_chars: Annotated[int, typer.Option(help="Characters shown per sample.")] = 1500,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Random samples with flagged spans highlighted, and per-rule counts over the source."""
        insp, extra = inspect(
            source,
            n=n,
            seed=seed,
            html=html,
            text_field=text_field,
            disable=disable or [],
            only_flagged=only_flagged,
        )
        if not as_json:
            _print_inspection(insp, max_chars, html)
        # Inspection reports; it does not judge: no findings, exit 0.
        emit([], as_json, extra=extra, title="data inspect")


def inspect(
    source: str,
    *,
    n: int = 20,
    seed: int = 0,
    html: Path | None = None,
    text_field: str = "text",
    disable: list[str] | None = None,
    only_flagged: bool = False,
) -> tuple[Inspection, dict[str, Any]]:
    """`trainguard data inspect`: (the sample and counts, the JSON's fields), with the HTML page
    written to `html` (refused before the source is read when it cannot be written)."""
    from trainguard.filters.inspection import inspect_source
    from trainguard.filters.render import render_html, visible

    if html is not None:
        refuse_overwrite({"--html": html}, {"SOURCE": source})
        check_writable(html)  # before reading the whole source
    insp = inspect_source(
        source,
        n=n,
        seed=seed,
        text_field=text_field,
        config=filter_config(None, None),
        disabled=check_disabled(disable or []),
        only_flagged=only_flagged,
    )
    if html is not None:
        atomic_write_text(html, render_html(insp, source))
    extra = {
        "total": insp.total,
        "flagged": insp.flagged,
        "by_code": insp.by_code,
        "html": str(html) if html else None,
        "samples": [
            {
                "index": s.index,
                "id": visible(s.record.id),
                "flags": [f.to_dict() for f in s.flags],
            }
            for s in insp.samples
        ],
    }
    return insp, extra


def _print_inspection(insp: Inspection, max_chars: int, html: Path | None) -> None:
    from trainguard.filters.render import counts_table, rich_sample, visible

    for s in insp.samples:
        title = f"#{s.index} {visible(s.record.id)}"
        console.print(rich_sample(title, s.record.text, s.flags, max_chars))
    console.print(counts_table(insp))
    if html is not None:
        console.print(f"HTML written to {html}")
