"""`trainguard check-model TARGET|--hf CONFIG [--vocab-size V] [--seq-len T] [--batch-size B]
[--dtype D] [--shadow-steps K] [--json]`: causality, gradient leak, batch independence,
train/serve and MoE drop checks, and with --dtype the precision audit (with --shadow-steps its
shadow run). TARGET is a model factory; `--hf` takes a Hugging Face config instead."""

from __future__ import annotations

from typing import Annotated

import typer

from trainguard.cli.common import console, emit
from trainguard.config.schema import SEED_MAX


def register(app: typer.Typer) -> None:
    @app.command("check-model")
    def check_model_cmd(
        target: Annotated[
            str | None,
            typer.Argument(
                help="path/to/file.py:factory or package.module:factory; factory() returns an "
                "nn.Module mapping LongTensor [B, T] to logits [B, T, V] (or a tuple whose "
                "first item is, or an object with .logits)."
            ),
        ] = None,
        hf: Annotated[
            str | None,
            typer.Option(
                "--hf",
                help="Instead of TARGET: a Hugging Face config.json or model folder, built with "
                "AutoModelForCausalLM.from_config (random weights, no download).",
            ),
        ] = None,
        vocab_size: Annotated[
            int | None,
            typer.Option(help="Token ids are drawn below this; default: the first nn.Embedding."),
        ] = None,
        seq_len: Annotated[int, typer.Option(min=2, help="Sequence length T.")] = 128,
        batch_size: Annotated[int, typer.Option(min=2, help="Batch size B.")] = 4,
        dtype: Annotated[
            str | None,
            typer.Option(help="Also audit training in this precision: fp32, bf16 or fp16."),
        ] = None,
        lr: Annotated[float, typer.Option(help="Learning rate for the update audit.")] = 3e-3,
        master_weights: Annotated[
            str, typer.Option(help="Dtype the weights are stored in (fp32, bf16, fp16).")
        ] = "fp32",
        shadow_steps: Annotated[
            int,
            typer.Option(
                min=0,
                help="With --dtype bf16/fp16: K SGD steps of the model with weights in that "
                "dtype against float64; N107 says whether the error grows like a bias.",
            ),
        ] = 0,
        seed: Annotated[
            int, typer.Option(min=0, max=SEED_MAX, help="Seed for tokens and dropout draws.")
        ] = 0,
        threads: Annotated[
            int | None, typer.Option(min=1, help="torch intra-op threads (default: torch's).")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Pre-flight model checks, in train and in eval mode: future-token leak, gradient leak
        map, batch independence, train/serve consistency, MoE token drops."""
        import torch

        from trainguard.checks.model_checks import check_target

        if threads is not None:
            torch.set_num_threads(threads)
        report, label, vocab = check_target(
            target,
            hf,
            vocab_size=vocab_size,
            seq_len=seq_len,
            batch_size=batch_size,
            dtype=dtype,
            lr=lr,
            master_weights=master_weights,
            shadow_steps=shadow_steps,
            seed=seed,
        )
        if not as_json:
            for name, s in report.stats.items():
                console.print(
                    f"{name}: {s.forwards} forward, {s.backwards} backward, {s.seconds:.2f} s",
                    markup=False,
                )
        extra = {k: v for k, v in report.to_dict().items() if k not in ("ok", "findings")}
        emit(
            report.findings,
            as_json,
            extra={"target": label, "vocab_size": vocab, **extra},
            title="check-model",
        )
