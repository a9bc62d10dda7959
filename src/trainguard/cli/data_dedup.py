"""`trainguard data dedup IN --out OUT`: remove exact and near duplicates (docs/dedup.md)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console, emit
from trainguard.config.schema import SEED_MAX
from trainguard.data.corpus import ACCEPTED


class Engine(StrEnum):
    local = "local"
    spark = "spark"


def register(app: typer.Typer) -> None:
    data = group(app, "data")

    @data.command("dedup")
    def data_dedup(
        source: Annotated[
            str, typer.Argument(help=f"{ACCEPTED} (--engine spark: one JSONL or Parquet file).")
        ],
        out: Annotated[
            str,
            typer.Option(
                "--out",
                help="Kept documents, in IN's format: a file (local engine) or a folder of "
                "part files (spark engine).",
            ),
        ],
        threshold: Annotated[
            float, typer.Option(help="Estimated Jaccard similarity at which to merge, in (0, 1].")
        ] = 0.8,
        engine: Annotated[Engine, typer.Option(help="Where to run.")] = Engine.local,
        clusters: Annotated[
            str | None,
            typer.Option(help="Clusters file (JSONL). Default: <OUT stem>.clusters.jsonl."),
        ] = None,
        bands: Annotated[int, typer.Option(help="LSH bands (FineWeb: 14).")] = 14,
        rows: Annotated[int, typer.Option(help="Hash values per band (FineWeb: 8).")] = 8,
        ngram: Annotated[int, typer.Option(help="Words per shingle.")] = 5,
        seed: Annotated[
            int, typer.Option(min=0, max=SEED_MAX, help="Seed of the MinHash functions.")
        ] = 1,
        text_field: Annotated[str, typer.Option(help="Field holding the text.")] = "text",
        id_field: Annotated[
            str, typer.Option(help="Field copied into the clusters file, if present.")
        ] = "id",
        spark_master: Annotated[
            str | None,
            typer.Option(help="Spark master URL. Default: $SPARK_MASTER, else local[*]."),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Remove exact (normalised) and near (MinHash LSH) duplicates, keeping the first."""
        from trainguard.dedup.lsh import DedupParams

        params = DedupParams(threshold=threshold, bands=bands, rows=rows, seed=seed, ngram=ngram)
        if engine is Engine.spark:
            from trainguard.dedup.spark import dedup_file_spark

            report = dedup_file_spark(
                source, out, clusters, params, text_field, id_field, master=spark_master
            )
        else:
            from trainguard.dedup.local import dedup_file

            report = dedup_file(source, Path(out), clusters, params, text_field, id_field)
        summary = report.summary()
        if not as_json:
            c = report.counts
            console.print(
                f"kept {c.kept} of {c.input} documents ({c.exact_duplicates} exact, "
                f"{c.near_duplicates} near duplicates removed) in {summary['seconds']:.2f} s "
                f"({summary['docs_per_s']} docs/s, {report.engine} engine) -> {report.out_path}; "
                f"clusters: {report.clusters_path}"
            )
        emit(report.findings, as_json, extra=summary, title="Deduplication")
