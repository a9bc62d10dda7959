"""`trainguard data prepare SOURCE --out DIR [--engine local|spark]`: the data preparation
`trainguard run` does, alone; with Spark, the same bytes built on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trainguard.cli._groups import group
from trainguard.cli.common import console, emit
from trainguard.cli.data_dedup import Engine
from trainguard.config.schema import DataConfig, TokenizerConfig
from trainguard.data.corpus import ACCEPTED
from trainguard.util.paths import refuse_overwrite

if TYPE_CHECKING:
    from trainguard.data.prepare import PreparedData


def register(app: typer.Typer) -> None:
    data = group(app, "data")
    d_data, d_tok = DataConfig(), TokenizerConfig()

    @data.command("prepare")
    def data_prepare(
        source: Annotated[str, typer.Argument(help=f"{ACCEPTED}.")],
        out: Annotated[
            Path,
            typer.Option("--out", help="Folder for the prepared data (one subfolder per key)."),
        ],
        vocab_size: Annotated[
            int, typer.Option(help="Byte-level BPE vocabulary size.")
        ] = d_tok.vocab_size,
        min_frequency: Annotated[
            int, typer.Option(help="Minimum pair count for a merge.")
        ] = d_tok.min_frequency,
        seq_len: Annotated[
            int, typer.Option(help="Tokens per sample (checked to fit).")
        ] = d_data.seq_len,
        text_field: Annotated[str, typer.Option(help="Text field of JSONL/Parquet.")] = "text",
        val_fraction: Annotated[
            float, typer.Option(help="Share of documents held out.")
        ] = d_data.val_fraction,
        shard_tokens: Annotated[
            int, typer.Option(help="Tokens per shard file.")
        ] = d_data.shard_tokens,
        engine: Annotated[
            Engine,
            typer.Option(help="Where to run; both write the same bytes (the cache serves both)."),
        ] = Engine.local,
        spark_master: Annotated[
            str | None,
            typer.Option(help="Spark master URL. Default: $SPARK_MASTER, else local[*]."),
        ] = None,
        progress: Annotated[bool, typer.Option(help="Progress bar on stderr.")] = True,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Clean, tokenize and shard a corpus into --out with its manifest (cached by content)."""
        prepared, extra = prepare(
            source,
            out,
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            seq_len=seq_len,
            text_field=text_field,
            val_fraction=val_fraction,
            shard_tokens=shard_tokens,
            engine=engine.value,
            spark_master=spark_master,
            progress=progress,
        )
        if not as_json:
            state = "reused" if prepared.reused else "prepared"
            console.print(
                f"{state} {prepared.dir}: {extra['train_tokens']} train and "
                f"{extra['val_tokens']} val tokens, vocabulary {prepared.vocab_size}"
            )
        emit(prepared.findings(seq_len), as_json, extra=extra, title="data prepare")


def prepare(
    source: str,
    out: Path,
    *,
    vocab_size: int,
    min_frequency: int,
    seq_len: int,
    text_field: str = "text",
    val_fraction: float,
    shard_tokens: int,
    engine: str = "local",
    spark_master: str | None = None,
    progress: bool = False,
) -> tuple[PreparedData, dict[str, Any]]:
    """`trainguard data prepare`: (the prepared data, the JSON's fields). The options are
    validated through the recipe schema (the usual key-naming messages); --out may not be or
    hold SOURCE."""
    from trainguard.config.load import validate_recipe
    from trainguard.data.prepare import prepare_data

    refuse_overwrite({"--out": out}, {"SOURCE": source})
    # Validate through the recipe schema so bad values get the usual key-naming messages.
    recipe = validate_recipe(
        {
            "data": {
                "source": source,
                "text_field": text_field,
                "seq_len": seq_len,
                "val_fraction": val_fraction,
                "shard_tokens": shard_tokens,
                "cache_dir": str(out),
            },
            "tokenizer": {"vocab_size": vocab_size, "min_frequency": min_frequency},
        },
        origin="data prepare options",
    )
    prepared = prepare_data(
        recipe.data,
        recipe.tokenizer,
        progress=progress,
        engine=engine,
        spark_master=spark_master,
    )
    extra = {
        "dir": str(prepared.dir),
        "reused": prepared.reused,
        "tokenizer_path": str(prepared.tokenizer_path),
        "vocab_size": prepared.vocab_size,
        "eot_id": prepared.eot_id,
        "train_tokens": int(prepared.train.n_tokens),
        "val_tokens": int(prepared.val.n_tokens),
        "train_samples": int(prepared.train.num_samples(seq_len)),
        "stats": prepared.stats.to_dict(),
    }
    return prepared, extra
