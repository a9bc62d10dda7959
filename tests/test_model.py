"""The reference GPT and its MoE feed-forward: shapes, init, causality, routing, learning."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainguard.config.schema import ModelConfig, MoEConfig
from trainguard.model.gpt import GPT
from trainguard.model.moe import MoEFeedForward, collect_router_stats, reset_router_stats

V, T = 64, 16
ROUTERS = ["token_choice", "dropless", "expert_choice"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # These models are tiny: a second intra-op thread only adds OpenMP spin-waiting, which on
    # a loaded 2-core machine makes a step tens of times slower. Restored for other modules.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_cfg(router: str | None = None, **moe_kw) -> ModelConfig:
    moe = None
    if router is not None:
        moe = MoEConfig(**{"n_experts": 4, "top_k": 1, "router": router, **moe_kw})
    return ModelConfig(n_layers=2, d_model=32, n_heads=4, dropout=0.0, moe=moe)


def make_model(router: str | None = None, seed: int = 0, **moe_kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(make_cfg(router, **moe_kw), vocab_size=V, seq_len=T)


def tokens(b: int = 2, t: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


# ---- shapes, errors, init ----------------------------------------------------------------


@pytest.mark.parametrize("router", [None, *ROUTERS])
def test_shapes(router):
    model = make_model(router)
    assert model(tokens(3, T)).shape == (3, T, V)
    assert model(tokens(2, 5)).shape == (2, 5, V)  # shorter than seq_len is fine


def test_too_long_sequence_is_a_clear_error():
    model = make_model()
    with pytest.raises(ValueError, match="seq_len=16"):
        model(tokens(1, T + 1))
    with pytest.raises(ValueError, match="batch, time"):
        model(tokens(1, T)[0])


def test_top_k_above_n_experts_is_rejected():
    with pytest.raises(ValueError, match="top_k"):
        MoEFeedForward(8, MoEConfig(n_experts=2, top_k=3))


@pytest.mark.parametrize("router", [None, "token_choice"])
def test_same_seed_gives_bitwise_same_init_and_logits(router):
    a, b, c = make_model(router, seed=7), make_model(router, seed=7), make_model(router, seed=8)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert torch.equal(a(tokens()), b(tokens()))
    assert not torch.equal(sa["lm_head.weight"], c.state_dict()["lm_head.weight"])


def test_input_and_output_embeddings_are_tied():
    model = make_model()
    assert model.lm_head.weight is model.transformer.wte.weight
    model(tokens()).sum().backward()
    assert model.transformer.wte.weight.grad is not None
    untied = sum(p.numel() for p in model.parameters()) + V * 32  # if the head had its own
    assert model.num_params() == untied - V * 32
    assert model.num_params(non_embedding=True) == model.num_params() - V * 32 - T * 32


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=8, d_model=128, n_heads=4)
    model = GPT(cfg, vocab_size=V, seq_len=T)
    block = model.transformer.h[0]
    assert block.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    scaled = 0.02 / math.sqrt(2 * cfg.n_layers)
    assert block.attn.c_proj.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert block.mlp.c_proj.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert torch.count_nonzero(block.attn.c_attn.bias) == 0
    torch.manual_seed(0)
    moe = GPT(cfg.model_copy(update={"moe": MoEConfig(n_experts=2)}), V, T)
    expert = moe.transformer.h[0].mlp.experts[1]
    assert expert.c_proj.weight.std().item() == pytest.approx(scaled, rel=0.05)


def test_moe_every_kth_block():
    cfg = make_cfg("token_choice", every=2).model_copy(update={"n_layers": 4})
    model = GPT(cfg, V, T)
    kinds = [isinstance(b.mlp, MoEFeedForward) for b in model.transformer.h]
    assert kinds == [False, True, False, True]
    assert len(model.moe_layers()) == 2


# ---- causality and batch independence ------------------------------------------------------


def perturbed_after(idx: torch.Tensor, cut: int, seed: int) -> torch.Tensor:
    """idx with every position >= cut replaced by different random tokens."""
    g = torch.Generator().manual_seed(seed)
    out = idx.clone()
    shift = torch.randint(1, V, out[:, cut:].shape, generator=g)
    out[:, cut:] = (out[:, cut:] + shift) % V  # guaranteed different at every future position
    return out


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("router", [None, "token_choice", "dropless"])
def test_future_tokens_do_not_change_earlier_logits(router, mode):
    # top_k=2 and a tight capacity so that drops (and their order) are exercised.
    model = make_model(router, top_k=2, capacity_factor=0.5) if router else make_model()
    model.train(mode == "train")
    idx = tokens(3, T, seed=3)
    with torch.no_grad():
        base = model(idx)
        for cut in (1, 5, 11, T - 1):
            for seed in range(3):
                out = model(perturbed_after(idx, cut, seed))
                assert torch.equal(out[:, :cut], base[:, :cut]), f"position < {cut} saw the future"
                assert not torch.equal(out[:, cut:], base[:, cut:])  # the perturbation is real


@pytest.mark.parametrize("router", ["dropless", "token_choice"])
def test_moe_layer_causal_bitwise_with_few_tokens_per_expert(router):
    # Few tokens per expert is where BLAS switches kernels with the row count; dropless pads
    # every expert's rows to a multiple of _ROW_BLOCK so that a token's output does not change
    # when later tokens join or leave its expert.
    for seed in range(6):
        layer = moe_layer(router, seed=seed, capacity_factor=0.75)
        x = torch.randn(1, 12, 16, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            base = layer(x)
            for cut in range(1, 12):
                x2 = x.clone()
                x2[:, cut:] = torch.randn(1, 12 - cut, 16)
                assert torch.equal(layer(x2)[:, :cut], base[:, :cut]), (seed, cut)


@pytest.mark.parametrize("router", [None, "token_choice", "dropless"])
def test_prefix_forward_matches_full_sequence(router):
    # Serving computes position t from the prefix alone. token_choice sizes capacity for the
    # model's context, not the input length, so a prefix drops what the full sequence drops.
    model = make_model(router, capacity_factor=0.5) if router else make_model()
    model.eval()
    idx = tokens(2, T, seed=4)
    with torch.no_grad():
        full = model(idx)
        for length in (1, 5, 11):
            torch.testing.assert_close(model(idx[:, :length]), full[:, :length])
    if router == "token_choice":
        assert all(s["tokens_dropped"] > 0 for s in collect_router_stats(model).values())


def test_expert_choice_leaks_the_future():
    # The leaky target: an expert's top-C over the sequence lets a later token evict an
    # earlier one. With capacity 2 of 16 per expert, a changed future reliably does that.
    model = make_model("expert_choice", capacity_factor=0.5)
    model.eval()
    idx = tokens(2, T, seed=3)
    with torch.no_grad():
        base = model(idx)
        leaked = [
            not torch.equal(model(perturbed_after(idx, 8, s))[:, :8], base[:, :8]) for s in range(5)
        ]
    assert any(leaked)


def test_capacity_by_score_leaks_the_future():
    # The variant the token_choice comment warns about: capacity given to the highest router
    # scores across the sequence. A later high-scoring token evicts an earlier one.
    model = make_model("token_choice", capacity_factor=0.5)
    for layer in model.moe_layers():
        layer.capacity_priority = "score"
    model.eval()
    idx = tokens(2, T, seed=3)
    with torch.no_grad():
        base = model(idx)
        leaked = [
            not torch.equal(model(perturbed_after(idx, 8, s))[:, :8], base[:, :8]) for s in range(5)
        ]
    assert any(leaked)


def test_capacity_by_score_keeps_the_highest_scores():
    layer = moe_layer("token_choice", top_k=1, capacity_factor=0.25)  # capacity 1 of 8
    layer.capacity_priority = "score"
    x = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = layer(x)[0]
        probs = F.softmax(x[0] @ layer.gate.weight.t(), dim=-1)  # (T, E)
    gate, chosen = probs.max(-1)
    later_won = False
    for e in chosen.unique().tolist():
        mine = (chosen == e).nonzero().squeeze(1)
        winner = int(mine[gate[mine].argmax()])
        later_won |= winner != int(mine[0])
        for t in mine.tolist():
            assert (torch.count_nonzero(out[t]) > 0) == (t == winner)
    assert later_won  # the case that tells score priority from position priority


@pytest.mark.parametrize("router", [None, "token_choice"])
def test_sample_does_not_depend_on_other_samples(router):
    model = make_model(router, top_k=2, capacity_factor=0.5) if router else make_model()
    model.eval()
    idx = tokens(4, T, seed=5)
    with torch.no_grad():
        base = model(idx)
        other = idx.clone()
        other[1:] = tokens(3, T, seed=6)  # replace every other sample
        out = model(other)
    assert torch.equal(out[0], base[0])
    assert not torch.equal(out[1], base[1])


# ---- routing correctness, drops, statistics ------------------------------------------------


def reference_moe(layer: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Per-token loops: what the gather/scatter code must compute (dropless)."""
    B, T_, C = x.shape
    flat = x.reshape(-1, C)
    probs = F.softmax(flat @ layer.gate.weight.t(), dim=-1)
    out = torch.zeros_like(flat)
    for n in range(flat.shape[0]):
        gate, chosen = probs[n].topk(layer.top_k)
        gate = gate / gate.sum() if layer.top_k > 1 else gate
        for g, e in zip(gate, chosen, strict=True):
            out[n] += g * layer.experts[int(e)](flat[n : n + 1])[0]
    return out.view(B, T_, C)


def moe_layer(router: str, seed: int = 0, **kw) -> MoEFeedForward:
    torch.manual_seed(seed)
    layer = MoEFeedForward(16, MoEConfig(**{"n_experts": 4, "router": router, **kw}))
    for p in layer.parameters():
        nn.init.normal_(p, std=0.5)  # spread the router so experts differ
    return layer


@pytest.mark.parametrize("top_k", [1, 2])
def test_dropless_matches_per_token_reference(top_k):
    layer = moe_layer("dropless", top_k=top_k)
    x = torch.randn(3, 10, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(layer(x), reference_moe(layer, x), rtol=1e-5, atol=1e-5)


def test_token_choice_with_room_for_all_equals_dropless():
    x = torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(0))
    tc, dl = moe_layer("token_choice", top_k=2, capacity_factor=4.0), moe_layer("dropless", top_k=2)
    with torch.no_grad():
        torch.testing.assert_close(tc(x), dl(x), rtol=1e-6, atol=1e-6)
    assert tc.router_stats()["tokens_dropped"] == 0


def test_token_choice_drops_latest_tokens_over_capacity():
    layer = moe_layer("token_choice", top_k=1, capacity_factor=0.25)  # capacity 1 of 8 tokens
    assert layer.capacity(8) == 1
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = layer(x)
        ref = reference_moe(layer, x)
        chosen = F.softmax(x @ layer.gate.weight.t(), dim=-1).argmax(-1)  # (B, T)
    n_kept = 0
    for b in range(2):
        seen: set[int] = set()
        for t in range(8):
            e = int(chosen[b, t])
            if e in seen:  # the expert is full: an earlier token took its only slot
                assert torch.count_nonzero(out[b, t]) == 0
            else:
                seen.add(e)
                n_kept += 1
                torch.testing.assert_close(out[b, t], ref[b, t], rtol=1e-5, atol=1e-5)
    stats = layer.router_stats()
    assert stats["tokens_routed"] == 16
    assert stats["tokens_dropped"] == 16 - n_kept > 0
    assert sum(stats["expert_counts"]) == n_kept


def test_expert_choice_matches_reference():
    layer = moe_layer("expert_choice", capacity_factor=0.5)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = layer(x)
        probs = F.softmax(x @ layer.gate.weight.t(), dim=-1)  # (B, T, E)
        ref = torch.zeros_like(x)
        cap = layer.capacity(8)
        for b in range(2):
            for e in range(4):
                for t in probs[b, :, e].topk(cap).indices:
                    ref[b, t] += probs[b, t, e] * layer.experts[e](x[b, t : t + 1])[0]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    stats = layer.router_stats()
    assert stats["expert_counts"] == [2 * cap] * 4
    unpicked = int((ref.abs().sum(-1) == 0).sum())
    assert stats["tokens_dropped"] == unpicked > 0


@pytest.mark.parametrize("router", ["token_choice", "dropless"])
def test_router_stats_count_drops_and_reset(router):
    model = make_model(router, top_k=2, capacity_factor=0.3)
    model(tokens(2, T))
    model(tokens(2, T, seed=9))
    stats = collect_router_stats(model)
    assert sorted(stats) == ["transformer.h.0.mlp", "transformer.h.1.mlp"]
    for s in stats.values():
        assert s["tokens_routed"] == 2 * (2 * T * 2)
        assert sum(s["expert_counts"]) == s["tokens_routed"] - s["tokens_dropped"]
        if router == "dropless":
            assert s["tokens_dropped"] == 0
        else:
            assert s["tokens_dropped"] > 0
    assert all(type(v) is int for s in stats.values() for v in s["expert_counts"])
    collect_router_stats(model, reset=True)
    assert all(s["tokens_routed"] == 0 for s in collect_router_stats(model).values())
    model(tokens())
    reset_router_stats(model)
    assert all(s["tokens_dropped"] == 0 for s in collect_router_stats(model).values())


def test_router_counters_stay_out_of_the_state_dict():
    model = make_model("token_choice")
    assert not any("stats" in k for k in model.state_dict())


def test_collect_router_stats_is_duck_typed():
    class Custom(nn.Module):
        def router_stats(self):
            return {"tokens_routed": 3, "tokens_dropped": 1}

        def reset_router_stats(self):
            pass

    class OnlyHalf(nn.Module):
        def router_stats(self):
            return {}

    net = nn.Sequential(nn.Linear(2, 2), Custom(), OnlyHalf())
    assert collect_router_stats(net) == {"1": {"tokens_routed": 3, "tokens_dropped": 1}}
    assert collect_router_stats(make_model()) == {}


# ---- losses, optimizer, learning, precision ------------------------------------------------


@pytest.mark.parametrize("router", ROUTERS)
def test_aux_loss_is_finite_positive_and_weighted(router):
    model = make_model(router, aux_loss_weight=0.5)
    model(tokens())
    aux = model.aux_loss()
    assert aux.dim() == 0 and torch.isfinite(aux) and aux.item() > 0
    unweighted = sum(layer.last_aux_loss for layer in model.moe_layers())
    assert aux.item() == pytest.approx(0.5 * unweighted.item())
    if router == "expert_choice":  # balanced by construction: exactly 1 per layer
        assert aux.item() == pytest.approx(0.5 * 2)
    else:
        assert aux.requires_grad


def test_aux_loss_is_zero_for_dense():
    model = make_model()
    model(tokens())
    aux = model.aux_loss()
    assert aux.dim() == 0 and aux.item() == 0.0


@pytest.mark.parametrize("router", [None, *ROUTERS])
def test_bf16_autocast_forward_on_cpu(router):
    model = make_model(router)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens())
        aux = model.aux_loss()
    assert logits.shape == (2, T, V) and logits.dtype == torch.bfloat16
    assert torch.isfinite(logits.float()).all() and torch.isfinite(aux)
    ref = make_model(router)(tokens())
    torch.testing.assert_close(logits.float(), ref, rtol=0.1, atol=0.1)
