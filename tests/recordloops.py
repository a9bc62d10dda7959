"""The four loops of issue 22 that leave a run record, each small enough to train in seconds,
and the model factories `trainguard eval --model` builds them with (tests/test_run_record.py).

(a) examples/ddp_loop.py as one process (a NaN at step 5: one skipped update);
(b) a GuardedTrainer (tiny GPT-2); (c) a Lightning run (a tiny LM); (d) `trainguard run` is
conftest's `finished_tiny_run`. Each (a)-(c) checkpoints every 4 steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STEPS, EVERY = 8, 4
VOCAB = 64  # the ddp example's; the test tokenizer has this many words (t0 .. t63)


def build_ddp(out: Path) -> None:
    args = [str(EXAMPLES / "ddp_loop.py"), "--out", str(out), "--max-steps", str(STEPS)]
    args += ["--checkpoint-every", str(EVERY), "--device", "cpu", "--inject", "nan@5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-3000:]


def ddp_model() -> torch.nn.Module:
    sys.path.insert(0, str(EXAMPLES))
    from toy_lm import tiny_gpt

    return tiny_gpt(torch.device("cpu"))


def _gpt2_config() -> Any:
    import transformers

    return transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=128, n_positions=16, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip


def hf_model() -> torch.nn.Module:
    import transformers

    return transformers.GPT2LMHeadModel(_gpt2_config())


def build_hf(out: Path) -> None:
    import transformers

    from trainguard import Guard
    from trainguard.integrations.hf import GuardedTrainer

    torch.manual_seed(0)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, VOCAB, (128, 16))]
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=STEPS, save_steps=EVERY, per_device_train_batch_size=4,
        report_to=[], use_cpu=True, seed=0, disable_tqdm=True, logging_steps=1,
    )  # fmt: skip
    trainer = GuardedTrainer(
        model=hf_model(), args=args, train_dataset=data, guard=Guard(run_dir=out)
    )
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    trainer.train()
    trainer.guard.close()


def _lightning_module() -> Any:
    import lightning as L

    class LM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.out = torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(torch.relu(self.emb(x)))  # (B, T, V)

        def training_step(self, x: torch.Tensor, i: int) -> torch.Tensor:
            logits = self(x[:, :-1])
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return LM


def lightning_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return _lightning_module()()


def build_lightning(out: Path) -> None:
    import lightning as L
    from torch.utils.data import DataLoader

    from trainguard import ElasticSampler, Guard
    from trainguard.integrations.lightning import (
        TrainguardLightningCallback,
        VerifiedModelCheckpoint,
        fit,
    )

    torch.manual_seed(0)
    data = torch.randint(0, VOCAB, (128, 17))
    sampler = ElasticSampler(len(data), global_batch_size=8, seed=0)
    trainer = L.Trainer(
        max_steps=STEPS, logger=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", devices=1,
        callbacks=[
            TrainguardLightningCallback(sampler, guard=Guard(run_dir=out)),
            VerifiedModelCheckpoint(out / "checkpoints", every_n_train_steps=EVERY),
        ],
    )  # fmt: skip
    fit(
        trainer,
        lightning_model(),
        train_dataloaders=DataLoader(data, sampler=sampler, batch_size=8),
    )
