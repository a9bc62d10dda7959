"""Mixture-of-experts feed-forward with three routers, and the router statistics protocol.

A softmax gate over `n_experts` scores each token (Shazeer et al. 2017); experts are GELU MLPs
the size of the dense feed-forward (Switch Transformer, Fedus et al. 2021), so at top_k=1 an MoE
layer costs what a dense one does per token.

Routers (`MoEConfig.router`):
- `token_choice`: each token picks its top-k experts; each expert takes at most
  `capacity = ceil(capacity_factor * L * top_k / n_experts)` tokens of ONE sequence, L being the
  model's context length (`seq_len`); the rest are dropped (their feed-forward output is zero,
  the residual stream carries them) and counted.
- `dropless`: top-k without a capacity limit (MegaBlocks, Gale et al. 2022); nothing is dropped.
- `expert_choice` (Zhou et al. 2022): each expert picks its top-C tokens of the sequence. That
  choice looks at every position, future ones included, so it is NOT causal; it exists as a
  real target for `check-model`.

All three dispatch with gather/scatter into one buffer of expert "slots" and loop over experts
(never over tokens). Two properties are kept on purpose, and tested:
- causality: a token's slot (which expert, which row) depends only on itself and earlier tokens;
- batch invariance: every expert runs on a row count that is fixed (capacity routers) or a
  multiple of `_ROW_BLOCK` (dropless), because BLAS picks different kernels, with different
  summation orders, for small row counts; without this, a token's output would change bitwise
  with how many OTHER tokens share its expert, and a bitwise causality check would misfire.

Router statistics protocol (docs/architecture.md): `router_stats()` and `reset_router_stats()`
on every MoE layer; `collect_router_stats(model)` finds them by duck typing.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from trainguard.config.schema import MoEConfig

# Rows per expert are padded up to a multiple of this in dropless routing (see module docstring).
_ROW_BLOCK = 16


class ExpertMLP(nn.Module):
    """One expert: the GPT-2 feed-forward, d_model -> 4 d_model -> d_model with GELU."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d_model, d_model)  # a residual projection (scaled init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))  # (M, C)


class MoEFeedForward(nn.Module):
    """The MoE feed-forward of one block: `forward(x: (B, T, C)) -> (B, T, C)`.

    After each forward, `last_aux_loss` holds the Switch Transformer load-balancing loss
    `n_experts * sum_i f_i * P_i` (unweighted), where f_i is the share of the router's
    assignments sent to expert i (before capacity) and P_i the mean router probability of i.
    It is 1 when balanced. For `expert_choice` every expert takes the same number of tokens, so
    f_i = 1/n_experts and the loss is the constant 1: that router is balanced by construction.
    """

    def __init__(
        self, d_model: int, cfg: MoEConfig, dropout: float = 0.0, seq_len: int | None = None
    ) -> None:
        super().__init__()
        if cfg.top_k > cfg.n_experts:
            raise ValueError(
                f"model.moe.top_k={cfg.top_k} exceeds model.moe.n_experts={cfg.n_experts}; "
                "a token cannot pick more experts than exist"
            )
        self.n_experts = cfg.n_experts
        self.top_k = cfg.top_k
        self.router = cfg.router
        self.capacity_factor = cfg.capacity_factor
        # token_choice sizes capacity for a full context of `seq_len` tokens (None: the input's
        # length), so that a shorter, prefix-only forward gets the same budget (see below).
        self.seq_len = seq_len
        # Which assignments get an expert's capacity first (token_choice). "position" is the
        # causal choice and the only one a recipe can select; "score" (across the sequence, by
        # router probability) leaks the future and exists for tests of `check-model`: set it
        # on a built layer, `layer.capacity_priority = "score"`.
        self.capacity_priority: Literal["position", "score"] = "position"
        # A collapsed router, planted: every token's router probabilities become one-hot on
        # this expert (the `collapse@N` fault of faults.py; tests of the MoE health
        # detectors). None, the default, routes normally.
        self.forced_expert: int | None = None
        self.gate = nn.Linear(d_model, cfg.n_experts, bias=False)  # W_g: router logits
        self.experts = nn.ModuleList(ExpertMLP(d_model) for _ in range(cfg.n_experts))
        self.dropout = nn.Dropout(dropout)
        self.last_aux_loss: torch.Tensor | None = None
        # Counters [tokens_routed, tokens_dropped, expert_counts...] as ONE int64 tensor, added
        # to in place each forward: no host sync on the hot path. A plain attribute, not a
        # buffer, so it stays out of state_dict/checkpoints and DDP's buffer broadcast does not
        # overwrite one rank's counts with rank 0's.
        self._stats = torch.zeros(2 + cfg.n_experts, dtype=torch.long)

    # ---- the router statistics protocol -------------------------------------------------

    def router_stats(self) -> dict[str, Any]:
        """Counts since the last reset, in token-to-expert assignments (= tokens at top_k=1).

        `tokens_routed`: assignments the router asked for (tokens x top_k). `tokens_dropped`:
        those not computed: over capacity (token_choice), 0 (dropless), or for expert_choice
        the shortfall of tokens that fewer than top_k experts chose. `expert_counts`:
        assignments each expert computed. `top_k`: the layer's assignments per token.
        """
        return self.stats_from_counts(self._stats.tolist())  # the one host sync, when asked

    def router_counts(self) -> torch.Tensor:
        """The raw counters `[tokens_routed, tokens_dropped, expert_counts...]` (int64, on the
        layer's device), for a loop that reads them in its own host sync; `stats_from_counts`
        turns the read values into `router_stats()`'s form."""
        return self._stats

    def stats_from_counts(self, values: list[float] | list[int]) -> dict[str, Any]:
        """`router_stats()`'s dict from the values of `router_counts()`, plus `top_k`."""
        return {
            "tokens_routed": int(values[0]),
            "tokens_dropped": int(values[1]),
            "expert_counts": [int(v) for v in values[2:]],
            "top_k": self.top_k,
        }

    def reset_router_stats(self) -> None:
        self._stats.zero_()

    def _count(self, routed: int, dropped: torch.Tensor, expert_counts: torch.Tensor) -> None:
        if self._stats.device != dropped.device:
            self._stats = self._stats.to(dropped.device)
        update = torch.cat([dropped.new_tensor([routed]), dropped.reshape(1), expert_counts])
        self._stats += update.to(torch.long)

    # ---- forward ------------------------------------------------------------------------

    def capacity(self, T: int, context: int | None = None) -> int:
        """Slots per expert for one sequence of T tokens: `capacity_factor * context * top_k /
        n_experts` rounded up, `context` defaulting to T. Never more than T: a sequence cannot
        send an expert more than T assignments, so more slots would only add empty rows."""
        share = self.capacity_factor * (context or T) * self.top_k / self.n_experts
        return max(1, min(T, math.ceil(share)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        x_flat = x.reshape(B * T, C)  # (N, C)
        # Router in fp32 even under autocast: Switch Transformer's "selective precision",
        # because a bf16 softmax over experts makes routing unstable.
        with torch.autocast(device_type=x.device.type, enabled=False):
            probs = F.softmax(F.linear(x_flat.float(), self.gate.weight.float()), dim=-1)  # (N, E)
        if self.forced_expert is not None:
            probs = F.one_hot(torch.full_like(probs[:, 0], self.forced_expert, dtype=torch.long),
                              self.n_experts).to(probs.dtype)  # fmt: skip
        if self.router == "expert_choice":
            out, assigned = self._expert_choice(x_flat, probs, B, T)
        else:
            out, assigned = self._token_choice(x_flat, probs, B, T)
        # Switch load-balancing loss: f_i from the router's assignments, P_i from probabilities.
        f = assigned.float() / assigned.sum().clamp(min=1)  # (E,)
        self.last_aux_loss = self.n_experts * (f * probs.mean(0)).sum()
        return self.dropout(out.reshape(B, T, C))

    def _run_experts(self, x_flat: torch.Tensor, slot_token: torch.Tensor, sizes: list[int]):
        """Expert e runs on the next sizes[e] slots; slot_token[s] is the token in slot s,
        or N for an empty slot (a zero row). Returns expert outputs per slot, (S + 1, C), with
        a final zero row that dropped assignments point at."""
        x_ext = torch.cat([x_flat, x_flat.new_zeros(1, x_flat.shape[1])])  # (N + 1, C)
        outs, start = [], 0
        for expert, size in zip(self.experts, sizes, strict=True):
            # A fresh gather per expert (not a view into one buffer): same layout every call.
            outs.append(expert(x_ext[slot_token[start : start + size]]))  # (size, C)
            start += size
        y = torch.cat(outs) if outs else x_flat.new_zeros(0, x_flat.shape[1])
        return torch.cat([y, y.new_zeros(1, y.shape[1])])  # (S + 1, C)

    def _token_choice(self, x_flat, probs, B: int, T: int):
        """token_choice and dropless: each token picks its top-k experts."""
        N, E, k = B * T, self.n_experts, self.top_k
        gate, expert = probs.topk(k, dim=-1)  # (N, k)
        if k > 1:  # renormalise over the chosen experts (GShard)
            gate = gate / gate.sum(-1, keepdim=True)
        # Assignments in token-major order: a = n * k + j. Queue positions come from a cumsum
        # in this order, so a token's position in its expert's queue counts only earlier
        # tokens (and its own earlier choices): the routing is causal.
        expert_a = expert.reshape(N * k)  # (A,)
        onehot = F.one_hot(expert_a, E)  # (A, E)
        wanted = onehot.sum(0)  # (E,) assignments per expert before capacity
        if self.router == "token_choice":
            # Capacity over ONE sequence, so a sample never depends on the others in the batch.
            # Priority by position, earliest first: a token is dropped only because of tokens
            # before it. Prioritising by router score across the sequence (as some Switch/GShard
            # implementations do) would let a later, higher-scoring token evict an earlier one:
            # the earlier position's output would then depend on the future.
            # The budget is sized for the model's full context, not this input's length: with
            # earliest-first priority, a prefix-only forward (serving) then drops exactly what
            # the full teacher-forced sequence drops at those positions. Sizing it by T would
            # give a short prefix a smaller budget and more drops: train/serve skew.
            cap = self.capacity(T, max(T, self.seq_len or T))
            pos = self._queue_positions(onehot.view(B, T * k, E), probs, expert_a)  # (A,)
            keep = pos < cap
            seq = torch.arange(N * k, device=x_flat.device) // (T * k)  # (A,) sample index
            n_slots = E * B * cap
            # Slot layout (E, B, cap): fixed shape, each sample its own rows.
            slot = torch.where(keep, (expert_a * B + seq) * cap + pos, n_slots)
            sizes = [B * cap] * E
            kept = (onehot * keep[:, None]).sum(0)
            dropped = (~keep).sum()
        else:  # dropless
            pos = onehot.cumsum(0).gather(1, expert_a[:, None]).squeeze(1) - 1  # (A,)
            padded = (wanted + _ROW_BLOCK - 1) // _ROW_BLOCK * _ROW_BLOCK  # (E,)
            offsets = padded.cumsum(0) - padded
            sizes = padded.tolist()  # host sync: expert row counts vary with the routing
            n_slots = sum(sizes)
            slot = offsets[expert_a] + pos
            kept, dropped = wanted, wanted.new_zeros(())
        token_a = torch.arange(N * k, device=x_flat.device) // k  # (A,)
        slot_token = torch.full((n_slots + 1,), N, dtype=torch.long, device=x_flat.device)
        slot_token.scatter_(0, slot, token_a)  # dropped ones all land in the spare last slot
        y = self._run_experts(x_flat, slot_token[:n_slots], sizes)  # (S + 1, C)
        y_a = y[slot].view(N, k, -1)  # (N, k, C); dropped -> the zero row
        out = (y_a * gate.unsqueeze(-1)).sum(1).to(x_flat.dtype)  # (N, C)
        self._count(N * k, dropped, kept)
        return out, wanted

    def _queue_positions(self, onehot: torch.Tensor, probs: torch.Tensor, expert_a: torch.Tensor):
        """Each assignment's place in its expert's queue within its sequence, (A,).

        onehot: (B, T*k, E) in token-major order. "position": earlier tokens first (causal).
        "score": highest router probability first, the leaky variant kept as a check target.
        """
        B, A_seq, E = onehot.shape
        if self.capacity_priority == "position":
            pos = onehot.cumsum(1)  # (B, T*k, E)
        else:
            score = probs.gather(1, expert_a.view(-1, self.top_k)).view(B, A_seq)
            order = score.sort(dim=1, descending=True, stable=True).indices  # (B, T*k)
            ranked = onehot.gather(1, order[..., None].expand(-1, -1, E)).cumsum(1)
            pos = torch.empty_like(ranked).scatter_(1, order[..., None].expand(-1, -1, E), ranked)
        return pos.view(B * A_seq, E).gather(1, expert_a[:, None]).squeeze(1) - 1

    def _expert_choice(self, x_flat, probs, B: int, T: int):
        """Zhou et al. 2022: expert e takes the C tokens of the sequence that score highest for
        it. Whether an early token is chosen depends on the scores of later ones: NOT causal."""
        N, E = B * T, self.n_experts
        cap = self.capacity(T)
        scores = probs.view(B, T, E).transpose(1, 2)  # (B, E, T)
        gate, t_idx = scores.topk(cap, dim=-1)  # (B, E, cap)
        token = t_idx + torch.arange(B, device=x_flat.device).view(B, 1, 1) * T
        slot_token = token.transpose(0, 1).reshape(-1)  # (E * B * cap,) expert-major slots
        y = self._run_experts(x_flat, slot_token, [B * cap] * E)[:-1]  # (S, C)
        weighted = (y * gate.transpose(0, 1).reshape(-1, 1)).to(x_flat.dtype)
        out = x_flat.new_zeros(N, x_flat.shape[1]).index_add(0, slot_token, weighted)  # (N, C)
        picks = torch.bincount(slot_token, minlength=N)  # (N,) experts per token
        dropped = (self.top_k - picks).clamp(min=0).sum()
        counts = torch.full((E,), B * cap, dtype=torch.long, device=x_flat.device)
        self._count(N * self.top_k, dropped, counts)
        return out, counts


def implements_router_stats(module: nn.Module) -> bool:
    """Duck-typed protocol test: has both `router_stats` and `reset_router_stats`."""
    return callable(getattr(module, "router_stats", None)) and callable(
        getattr(module, "reset_router_stats", None)
    )


def collect_router_stats(model: nn.Module, reset: bool = False) -> dict[str, dict]:
    """`{qualified module name: router_stats()}` for every module with the protocol.

    With `reset=True` each module's counters are zeroed after being read (per-interval counts).
    """
    stats: dict[str, dict] = {}
    for name, module in model.named_modules():
        if implements_router_stats(module):
            stats[name] = module.router_stats()
            if reset:
                module.reset_router_stats()
    return stats


def reset_router_stats(model: nn.Module) -> None:
    """Zero the counters of every module with the router statistics protocol."""
    for module in model.modules():
        if implements_router_stats(module):
            module.reset_router_stats()
