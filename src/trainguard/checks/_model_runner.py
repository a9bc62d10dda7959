"""The harness every model check shares: pinned-RNG forwards, logits extraction, accounting.

Checks compare forwards exactly, so each forward draws its dropout masks from the same seed
(`torch.random.fork_rng`), and the caller's RNG state is left untouched. The token embedding's
output is captured by a forward hook (a fresh leaf, so gradients stop there and never touch
`param.grad`). `ModelState` snapshots modes, parameters and buffers (BatchNorm running
statistics) so the model is left exactly as it was found.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainguard.errors import BadInputError
from trainguard.numerics.logits import extract_logits


class ModelCheckInputError(BadInputError):
    """The model cannot be checked as given (bad output shape, forward raised)."""


@dataclass
class CheckStats:
    """Cost of one check: forward and backward passes and wall seconds."""

    forwards: int = 0
    backwards: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"forwards": self.forwards, "backwards": self.backwards, "seconds": self.seconds}


class ModelState:
    """Modes, parameters and buffers of a model, to restore after checking it."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.modes = [(m, m.training) for m in model.modules()]
        self.tensors = {
            k: v.detach().clone()
            for k, v in model.state_dict(keep_vars=True).items()
            if isinstance(v, torch.Tensor)
        }

    def restore(self) -> None:
        live = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for k, saved in self.tensors.items():
                live[k].copy_(saved)
        for m, training in self.modes:
            m.training = training


def set_mode(model: nn.Module, mode: str) -> None:
    model.train(mode == "train")


class ModelRunner:
    """Forwards with pinned randomness, logits validation and per-check accounting."""

    def __init__(
        self, model: nn.Module, vocab_size: int, seq_len: int, batch_size: int, seed: int
    ) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        first = next(iter(model.parameters()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.stats: dict[str, CheckStats] = {}
        self._gen = torch.Generator().manual_seed(seed)
        self._capture: list[torch.Tensor] | None = None
        self._current_input: torch.Tensor | None = None
        self.embedding_found: bool | None = None
        self.moe_drops: dict[str, dict] = {}

    # --- inputs -----------------------------------------------------------------------------
    def tokens(self, *shape: int) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, shape, generator=self._gen).to(self.device)

    def resample_from(self, x: torch.Tensor, row: int | slice, cut: int) -> None:
        """Replace x[row, cut:] in place; position `cut` is guaranteed to change."""
        fresh = self.tokens(*x[row, cut:].shape)
        shift = torch.randint(1, self.vocab_size, x[row, cut].shape, generator=self._gen)
        fresh[..., 0] = (x[row, cut] + shift.to(self.device)) % self.vocab_size
        x[row, cut:] = fresh

    # --- accounting ------------------------------------------------------------------------
    @contextmanager
    def timed(self, check: str) -> Iterator[CheckStats]:
        stats = self.stats.setdefault(check, CheckStats())
        t0 = time.perf_counter()
        try:
            yield stats
        finally:
            stats.seconds += time.perf_counter() - t0

    # --- forwards --------------------------------------------------------------------------
    def _embedding_hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> Any:
        # Only the token embedding sees the input ids themselves (positional ones see arange).
        if self._capture is None or self._capture or not inputs:
            return None
        ids = inputs[0]
        x = self._current_input
        if x is None or not isinstance(ids, torch.Tensor) or ids.shape != x.shape:
            return None
        if ids is not x and not torch.equal(ids, x):
            return None
        leaf = output.detach().requires_grad_(True)
        self._capture.append(leaf)
        return leaf

    def forward(
        self, x: torch.Tensor, stats: CheckStats, seed: int | None = None, grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V) of `x` with dropout drawn from `seed`; with grad, the embedding leaf."""
        seed = self.seed if seed is None else seed
        devices = [self.device] if self.device.type == "cuda" else []
        handles = []
        if grad:
            self._capture = []
            handles = [
                m.register_forward_hook(self._embedding_hook)
                for m in self.model.modules()
                if isinstance(m, nn.Embedding)
            ]
        self._current_input = x
        try:
            with torch.random.fork_rng(devices=devices), torch.set_grad_enabled(grad):
                torch.manual_seed(seed)
                try:
                    out = self.model(x)
                except Exception as e:  # the user's model: report it as bad input
                    raise ModelCheckInputError(
                        f"the model's forward raised {type(e).__name__}: {e} "
                        f"(input LongTensor of shape {list(x.shape)})",
                        "make factory() return a module mapping LongTensor [B, T] to logits "
                        "[B, T, V]; check --seq-len against the model's context length and "
                        "--vocab-size against its embedding",
                    ) from e
        finally:
            for h in handles:
                h.remove()
            self._current_input = None
        stats.forwards += 1
        logits = extract_logits(out)
        if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(x.shape):
            raise ModelCheckInputError(
                f"the model's logits have shape {list(logits.shape)} for input "
                f"{list(x.shape)}; expected [B, T, V] = [{x.shape[0]}, {x.shape[1]}, V]",
                "return per-position logits [B, T, V] (not a pooled or flattened tensor)",
            )
        emb = None
        if grad:
            emb = self._capture[0] if self._capture else None
            self.embedding_found = emb is not None
            self._capture = None
        return logits, emb


def logit_change(a: torch.Tensor, b: torch.Tensor, dim: int | tuple[int, ...] = -1) -> torch.Tensor:
    """max |a - b| over `dim`, on the entries finite in both (0 where none is).

    Non-finite logits are their own finding (M108). Left in, one NaN would make every
    difference and every tolerance NaN, and every `>` comparison silently False.
    """
    a, b = a.detach().float(), b.detach().float()
    both = torch.isfinite(a) & torch.isfinite(b)
    return torch.where(both, (a - b).abs(), torch.zeros((), device=a.device)).amax(dim=dim)


def finite_abs_max(x: torch.Tensor) -> float:
    """The largest finite |x| (0.0 when there is none); a deliberate host sync."""
    x = x.detach().float()
    return float(torch.where(torch.isfinite(x), x.abs(), torch.zeros((), device=x.device)).max())


def position_ranges(positions: list[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9': compact lists of positions for messages."""
    if not positions:
        return ""
    out, start, prev = [], positions[0], positions[0]
    for p in positions[1:]:
        if p == prev + 1:
            prev = p
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = p
    out.append(f"{start}-{prev}" if prev > start else str(start))
    return ", ".join(out)


def cut_points(seq_len: int, n: int) -> list[int]:
    """n cut points spread over [1, T-1], the first and the last positions included."""
    if seq_len < 2:
        return []
    n = min(n, seq_len - 1)
    if n == 1:
        return [seq_len - 1]
    pts = {round(1 + i * (seq_len - 2) / (n - 1)) for i in range(n)}
    return sorted(pts)
