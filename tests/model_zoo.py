"""A zoo of small language models for the model checks: causal ones and leaky ones.

Each model maps LongTensor [B, T] to logits [B, T, V] (or a tuple / an object with `.logits`).
`CAUSAL` models must pass `run_model_checks` with no error finding; each `LEAKY` entry names
the codes its fault must raise. Widths are tiny so that a whole zoo runs in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

D, HEADS, MAX_LEN = 32, 2, 512


class Attention(nn.Module):
    """Multi-head self-attention; `mask` is sdpa (is_causal), masked, none or offbyone."""

    def __init__(self, d: int, heads: int, mask: str = "sdpa", dropout: float = 0.0) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.heads, self.mask, self.p = heads, mask, dropout

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, c = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        p = self.p if self.training else 0.0
        if self.mask == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])  # (B, H, T, T)
            if self.mask != "none":
                # masked: key s is hidden from query t when s > t; offbyone lets t see t+1.
                diagonal = 1 if self.mask == "masked" else 2
                future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=h.device), diagonal)
                att = att.masked_fill(future, float("-inf"))
            y = F.dropout(att.softmax(-1), p, self.training) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class CausalConv(nn.Module):
    """Depthwise convolution padded on the left only: position t sees t-k+1..t."""

    def __init__(self, d: int, k: int = 3) -> None:
        super().__init__()
        self.conv, self.k = nn.Conv1d(d, d, k, groups=d), k

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(h.transpose(1, 2), (self.k - 1, 0))).transpose(1, 2)


class MoE(nn.Module):
    """Top-1 MoE feed-forward with router statistics. Experts run densely (tiny) and are masked.

    dropless: every token kept. capacity: token choice, each expert keeps the first `cap`
    tokens of a sequence in position order (causal), the rest dropped. expert_choice: each
    expert picks its top-`cap` tokens by score over the whole sequence (sees the future).
    """

    def __init__(self, d: int, router: str, n_experts: int = 4, capacity_factor: float = 1.25):
        super().__init__()
        self.gate = nn.Linear(d, n_experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
            for _ in range(n_experts)
        )
        self.router, self.cf, self.e = router, capacity_factor, n_experts
        self.reset_router_stats()

    def reset_router_stats(self) -> None:
        self.routed, self.dropped = 0, 0

    def router_stats(self) -> dict:
        return {"tokens_routed": self.routed, "tokens_dropped": self.dropped}

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        probs = self.gate(h).softmax(-1)  # (B, T, E)
        cap = max(1, int(self.cf * t / self.e))
        if self.router == "expert_choice":
            top = probs.topk(min(cap, t), dim=1).indices  # (B, cap, E): tokens per expert
            sel = torch.zeros_like(probs).scatter_(1, top, 1.0)
        else:
            sel = F.one_hot(probs.argmax(-1), self.e).to(probs.dtype)
            if self.router == "capacity":
                sel = sel * (sel.cumsum(1) <= cap)  # queue in position order
        kept = sel.sum(-1) > 0  # (B, T)
        self.routed += b * t
        self.dropped += int((~kept).sum())
        out = torch.stack([ex(h) for ex in self.experts], -1)  # (B, T, C, E)
        return (out * (sel * probs).unsqueeze(2)).sum(-1)


class GlobalPool(nn.Module):
    """Adds the mean over the whole sequence to every position (a leak)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + h.mean(1, keepdim=True)


class FaintPool(nn.Module):
    """Adds 1e-30 times the sequence mean: below the rounding of h, but a nonzero gradient."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + 1e-30 * h.mean(1, keepdim=True)


class TimeBatchNorm(nn.Module):
    """BatchNorm over channels: train-mode statistics span the batch and all positions."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.bn(h.transpose(1, 2)).transpose(1, 2)


class BatchCenter(nn.Module):
    """Train mode: subtracts the batch mean at each position (batch-dependent, causal)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h - h.mean(0, keepdim=True) if self.training else h


class Block(nn.Module):
    def __init__(self, mixer: nn.Module, ffn: nn.Module, extra: nn.Module | None, d: int, p: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mixer, self.ffn, self.extra, self.drop = mixer, ffn, extra, nn.Dropout(p)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.drop(self.mixer(self.ln1(h)))
        if self.extra is not None:
            h = self.extra(h)
        return h + self.drop(self.ffn(self.ln2(h)))


class TinyLM(nn.Module):
    """Token + position embeddings, `n_layers` blocks, final norm, linear head."""

    def __init__(
        self,
        vocab: int,
        mixer: str = "sdpa",
        ffn: str = "mlp",
        extra: str | None = None,
        dropout: float = 0.0,
        n_layers: int = 2,
        capacity_factor: float = 1.25,
        output: str = "tensor",
        d: int = D,
        heads: int = HEADS,
    ) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(MAX_LEN, d)
        self.drop, self.output = nn.Dropout(dropout), output
        blocks = []
        for i in range(n_layers):
            mix = CausalConv(d) if mixer == "conv" else Attention(d, heads, mixer, dropout)
            if ffn == "mlp":
                f: nn.Module = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            else:
                f = MoE(d, ffn, capacity_factor=capacity_factor)
            ext = _EXTRA[extra](d) if extra and i == n_layers - 1 else None
            blocks.append(Block(mix, f, ext, d, dropout))
        self.blocks = nn.ModuleList(blocks)
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor):
        t = idx.shape[1]
        h = self.drop(self.wte(idx) + self.wpe(torch.arange(t, device=idx.device)))  # (B, T, C)
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.ln_f(h))  # (B, T, V)
        if self.output == "tuple":
            return logits, None
        if self.output == "hf":
            return CausalLMOutput(logits=logits)
        return logits


@dataclass
class CausalLMOutput:
    """Hugging Face style output: the logits in an attribute."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


_EXTRA = {
    "pool": lambda d: GlobalPool(),
    "faint": lambda d: FaintPool(),
    "timebn": TimeBatchNorm,
    "batchcenter": lambda d: BatchCenter(),
}

# name -> keyword arguments of TinyLM. Must raise no error finding.
CAUSAL = {
    "sdpa": {},
    "sdpa_dropout": {"dropout": 0.1},
    "hand_mask_dropout": {"mixer": "masked", "dropout": 0.1},
    "causal_conv_dropout": {"mixer": "conv", "dropout": 0.1},
    "dropless_moe": {"ffn": "dropless"},
    "hf_output": {"output": "hf", "dropout": 0.1},
    "tuple_output": {"output": "tuple", "mixer": "masked"},
}

# name -> (TinyLM kwargs, codes that must be among the error findings, codes that must not).
LEAKY = {
    "no_mask": ({"mixer": "none"}, {"M101", "M102", "M104"}, set()),
    "mask_off_by_one": ({"mixer": "offbyone"}, {"M101", "M102", "M104"}, {"M103"}),
    "expert_choice_moe": ({"ffn": "expert_choice"}, {"M101"}, {"M103"}),
    "batch_stats_over_time": ({"extra": "timebn"}, {"M101", "M103"}, set()),
    "pool_over_sequence": ({"extra": "pool"}, {"M101", "M102", "M104"}, {"M103"}),
    "faint_pool": ({"extra": "faint"}, {"M102"}, {"M101", "M103", "M104"}),
    "batch_centering": ({"extra": "batchcenter"}, {"M103"}, {"M101", "M102", "M104"}),
}


def make(name: str, vocab: int, seed: int = 0) -> TinyLM:
    """A zoo model by name, initialised from `seed`."""
    kwargs = CAUSAL[name] if name in CAUSAL else LEAKY[name][0]
    torch.manual_seed(seed)
    return TinyLM(vocab, **kwargs)


def factory() -> nn.Module:
    """For `trainguard check-model tests/model_zoo.py:factory` (a causal model, vocab 64)."""
    return make("sdpa", 64)


def leaky_factory() -> nn.Module:
    """For `trainguard check-model tests/model_zoo.py:leaky_factory` (no mask, vocab 64)."""
    return make("no_mask", 64)
