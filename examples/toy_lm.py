"""What `ddp_loop.py` and `fsdp2_loop.py` share and is not the point of either: a tiny GPT,
synthetic token data, the learning-rate schedule, the per-step log, the final weights, and the
fault injection the tests use. Replace these with your own model, data and logging.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import Dataset

from trainguard.config.schema import ModelConfig
from trainguard.data.order import batch_hash
from trainguard.metrics.jsonl import MetricsLog
from trainguard.model.gpt import GPT
from trainguard.util.hashing import file_checksum

VOCAB, SEQ_LEN = 64, 16


def arguments(doc: str) -> argparse.Namespace:
    """The examples' command line."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="checkpoints and logs")
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--inject", help="for the tests: nan@A-B,kill@K/rR (see Faults)")
    return p.parse_args()


def tiny_gpt(device: torch.device) -> GPT:
    """trainguard's GPT-2 (nanoGPT's layout, tied head) at a size that trains in seconds on CPU;
    the same initial weights on every rank (DDP would broadcast rank 0's anyway)."""
    torch.manual_seed(1337)
    return GPT(ModelConfig(n_layers=2, d_model=32, n_heads=2), VOCAB, SEQ_LEN).to(device)


class MarkovTokens(Dataset):
    """Token sequences from a fixed Markov chain (each token has a few likely successors), so
    the loss falls from ln(VOCAB) towards the chain's entropy. Sample i is (i, input, target):
    its id (for the data log), the sequence, and the sequence shifted by one. Samples in
    `empty` are padding only: every target is ignored (-100), so a batch of them has a
    0/0 = NaN loss, as a shard of empty documents gives."""

    def __init__(self, num_samples: int, seed: int = 0, empty: frozenset[int] = frozenset()):
        g = torch.Generator().manual_seed(seed)
        successors = torch.softmax(4 * torch.randn(VOCAB, VOCAB, generator=g), dim=-1)
        tokens = torch.empty(num_samples, SEQ_LEN + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(VOCAB, (num_samples,), generator=g)
        for t in range(SEQ_LEN):
            tokens[:, t + 1] = torch.multinomial(successors[tokens[:, t]], 1, generator=g)[:, 0]
        self.tokens, self.empty = tokens, empty

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        x, y = self.tokens[i, :-1], self.tokens[i, 1:]
        return i, x, torch.full_like(y, -100) if i in self.empty else y


def lr_at(step: int, max_steps: int, peak: float = 3e-3, warmup: int = 2) -> float:
    """nanoGPT's schedule: linear warm-up, cosine decay to a tenth. A pure function of the
    step, so there is no scheduler state to checkpoint."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, max_steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


class StepLog:
    """Rank 0's JSON lines (trainguard's MetricsLog: appended across restarts, flushed per row,
    NaN written as "nan"): one row per step the guard judged, with the hash of the step's
    global batch (`run`'s `batch_hash`: the same for any world size) and of the sample ids rank
    0 actually read (`read_hash`; equal to `batch_hash` with one rank)."""

    def __init__(self, path: Path, rank: int) -> None:
        self.log = MetricsLog(path.parent, path.name) if rank == 0 else None

    def step(self, step: int, sampler, read: list[torch.Tensor], loss: torch.Tensor, action: str):
        self.write(
            step=step,
            batch_hash=sampler.batch_hash(step),
            read_hash=batch_hash(torch.cat(read).numpy()),
            loss=loss.item(),  # rank 0's share; the guard has synced it already
            action=action,
            world_size=sampler.world_size,
        )

    def write(self, **row: object) -> None:
        if self.log is not None:
            self.log.write(row)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def export_weights(model: torch.nn.Module, path: Path, rank: int) -> str | None:
    """Write the full weights to `path` (safetensors) on rank 0 and return the file's hash
    there (xxh3-128; the same tensors always serialise to the same bytes). A collective for an
    FSDP2 model (its shards are gathered to rank 0)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)
    if rank != 0:
        return None
    # Cloned: the tied head and embedding are one tensor, which safetensors refuses to share.
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in full.items()}, str(path))
    return file_checksum(path)


class Faults:
    """For the tests only: `--inject nan@A-B,kill@K/rR`. `nan@A-B` makes the samples that steps
    A..B read in a clean run padding only (a NaN storm the guard answers with a rollback);
    `kill@K/rR` SIGKILLs rank R as it starts step K (a crash to resume from)."""

    def __init__(self, spec: str | None) -> None:
        self.nan_steps: range = range(0)
        self.kill: tuple[int, int] | None = None
        for item in filter(None, (spec or "").split(",")):
            kind, _, where = item.partition("@")
            if kind == "nan":
                a, _, b = where.partition("-")
                self.nan_steps = range(int(a), int(b or a) + 1)
            elif kind == "kill":
                step, _, rank = where.partition("/r")
                self.kill = (int(step), int(rank or 0))
            else:
                raise SystemExit(f"--inject: unknown fault {item!r} (nan@A-B, kill@K/rR)")

    def empty_samples(self, sampler) -> frozenset[int]:
        """The samples of the NaN steps, as a sampler with no recorded skips reads them."""
        return frozenset(int(i) for s in self.nan_steps for i in sampler.batch_ids(s))

    def at_step(self, step: int, rank: int) -> None:
        if self.kill == (step, rank):
            os.kill(os.getpid(), signal.SIGKILL)
