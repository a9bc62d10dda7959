"""The reference GPT: GPT-2 (Radford et al. 2019) as nanoGPT writes it, plus optional MoE.

Pre-LayerNorm blocks, causal self-attention, learned position embeddings, a GELU MLP 4x wide,
a final LayerNorm and an output head tied to the token embedding (Press & Wolf 2017).
Shapes: B batch, T time (positions), C d_model, V vocabulary, H heads, D head size.
Nothing here assumes CUDA: the same code runs on CPU, CUDA or MPS.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainguard.config.schema import ModelConfig
from trainguard.model.moe import MoEFeedForward


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # q, k, v for all heads at once
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)  # a residual projection (scaled init)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        # (B, T, C) -> (B, H, T, D)
        q = q.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        k = k.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        v = v.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        # is_causal: position t attends to positions <= t only. The fused kernel applies the
        # mask itself, so there is no hand-built mask to get wrong.
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (B, H, T, D)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads: (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)  # a residual projection
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (B, T, C)


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + ffn(ln(x))."""

    def __init__(self, cfg: ModelConfig, moe: bool, seq_len: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp: nn.Module
        if moe and cfg.moe is not None:
            self.mlp = MoEFeedForward(cfg.d_model, cfg.moe, cfg.dropout, seq_len)
        else:
            self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        x = x + self.mlp(self.ln_2(x))  # (B, T, C)
        return x


class GPT(nn.Module):
    """`GPT(cfg, vocab_size, seq_len)`; `forward(idx: (B, T) int64) -> logits (B, T, V)`."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, seq_len: int) -> None:
        super().__init__()
        if vocab_size < 1 or seq_len < 1:
            raise ValueError(f"vocab_size={vocab_size} and seq_len={seq_len} must be >= 1")
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        every = cfg.moe.every if cfg.moe is not None else 0
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab_size, cfg.d_model),  # token embedding
                wpe=nn.Embedding(seq_len, cfg.d_model),  # learned position embedding
                drop=nn.Dropout(cfg.dropout),
                # Every `every`-th block gets the MoE feed-forward (blocks every-1, 2*every-1, ..)
                h=nn.ModuleList(
                    Block(cfg, moe=every > 0 and (i + 1) % every == 0, seq_len=seq_len)
                    for i in range(cfg.n_layers)
                ),
                ln_f=nn.LayerNorm(cfg.d_model),
            )
        )
        self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        # Weight tying: the output head IS the token embedding (one tensor, two uses).
        self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        # GPT-2: each block adds two residual branches, so the stream's variance grows with
        # depth; scale the projections into it by 1/sqrt(2 * n_layers) to keep it constant.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() != 2:
            raise ValueError(f"idx must be (batch, time) token ids, got shape {tuple(idx.shape)}")
        if idx.size(1) > self.seq_len:
            raise ValueError(
                f"sequence of {idx.size(1)} tokens is longer than the model's "
                f"seq_len={self.seq_len} (its position embedding has no row for it); crop the "
                "input or build the model with a larger seq_len"
            )
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        tok_emb = self.transformer.wte(idx)  # (B, T, C)
        pos_emb = self.transformer.wpe(pos)  # (T, C), broadcast over the batch
        x = self.transformer.drop(tok_emb + pos_emb)  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)  # (B, T, C)
        return self.lm_head(x)  # (B, T, V)

    def moe_layers(self) -> list[MoEFeedForward]:
        return [m for m in self.modules() if isinstance(m, MoEFeedForward)]

    def aux_loss(self) -> torch.Tensor:
        """The MoE load-balancing loss of the last forward, summed over MoE layers and times
        `moe.aux_loss_weight`: add it to the training loss. A 0-dim zero for dense models."""
        total = self.lm_head.weight.new_zeros(())
        if self.cfg.moe is None:
            return total
        for layer in self.moe_layers():
            if layer.last_aux_loss is not None:
                total = total + layer.last_aux_loss
        return total * self.cfg.moe.aux_loss_weight

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters, the tied embedding counted once. `non_embedding=True` leaves out the
        position embedding (and the token embedding, which the head reuses), as scaling laws
        count N (Kaplan et al. 2020)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel() + self.transformer.wte.weight.numel()
        return n
