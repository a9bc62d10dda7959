"""check-precision: reduction bias and noise, the fp32 remedy, the model-level audit and the
shadow-run growth exponent."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import model_zoo
from runhelpers import invoke_cli
from trainguard.checks.precision_audit import audit_model_precision
from trainguard.checks.precision_reduction import check_reduction
from trainguard.errors import BadInputError
from trainguard.numerics import (
    fit_bias_noise,
    growth_exponent,
    reduce_sum,
    shadow_run,
    simulate_gradients,
)
from trainguard.numerics.shadow import pattern_batches, round_to

VOCAB = 64


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def codes(findings) -> set[str]:
    return {f.code for f in findings}


# --- reduction bias -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype,world", [("bf16", 512), ("fp16", 4096)])
def test_low_precision_ring_is_biased_and_fp32_accumulation_is_not(dtype: str, world: int):
    findings, audit = check_reduction(dtype, world, "ring", n_elements=1024)
    assert "N101" in codes(findings)
    assert audit.slope < 1 - 1e-3  # swamping loses small increments: the sum shrinks
    remedy, fixed = check_reduction(dtype, world, "fp32-accumulate", n_elements=1024)
    assert "N101" not in codes(remedy) and fixed.bias < 1e-3


@pytest.mark.parametrize("world", [2, 64, 4096])
def test_fp32_passes_at_any_world_size(world: int) -> None:
    findings, audit = check_reduction("fp32", world, "ring", n_elements=1024, seed=world)
    assert findings == [] and audit.bias < 1e-6


@pytest.mark.parametrize("seed", [0, 1])
def test_small_world_bf16_and_tree_pass(seed: int) -> None:
    assert check_reduction("bf16", 4, "ring", 1024, seed)[0] == []
    assert check_reduction("bf16", 512, "tree", 1024, seed)[0] == []


def test_noise_above_bound_warns() -> None:
    findings, audit = check_reduction("bf16", 256, "ring", n_elements=2048)
    assert "N102" in codes(findings) and audit.noise > 1e-2


def test_reduce_sum_emulates_rounding_after_every_add() -> None:
    # bf16 keeps 8 significant bits: 2^-8 is half an ulp of 1, so 1 + 2^-8 rounds to even (1).
    # The ring adds 1, 0, 2^-8, 2^-8 in turn and loses both; the tree adds the two small
    # terms first (2^-7, a whole ulp) and keeps them; fp32 accumulation keeps them too.
    x = torch.tensor([[1.0], [0.0], [2.0**-8], [2.0**-8]], dtype=torch.bfloat16)
    assert float(reduce_sum(x, "ring")) == 1.0
    assert float(reduce_sum(x, "tree")) == 1.0 + 2.0**-7
    assert float(reduce_sum(x, "fp32-accumulate")) == 1.0 + 2.0**-7


def test_fit_separates_bias_from_noise() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, generator=gen, dtype=torch.float64)
    slope, noise = fit_bias_noise(0.98 * x, x)
    assert slope == pytest.approx(0.98) and noise == pytest.approx(0.0, abs=1e-12)
    e = torch.randn(10_000, generator=gen, dtype=torch.float64)
    slope, noise = fit_bias_noise(x + 0.05 * e, x)
    assert abs(1 - slope) < 2e-3 and noise == pytest.approx(0.05, rel=0.05)


def test_simulated_gradients_have_signal_and_dtype() -> None:
    g = simulate_gradients(8, 512, torch.bfloat16, seed=3)
    assert g.shape == (8, 512) and g.dtype == torch.bfloat16
    assert torch.equal(g, simulate_gradients(8, 512, torch.bfloat16, seed=3))  # reproducible


def test_bad_reduction_arguments() -> None:
    with pytest.raises(BadInputError, match="dtype"):
        check_reduction("int8", 4)
    with pytest.raises(BadInputError, match="algorithm"):
        check_reduction("bf16", 4, "butterfly")


# --- shadow run ---------------------------------------------------------------------------


def test_growth_exponent_of_known_curves() -> None:
    ks = range(1, 41)
    assert growth_exponent([3.0 * k for k in ks]) == pytest.approx(1.0)
    assert growth_exponent([0.1 * math.sqrt(k) for k in ks]) == pytest.approx(0.5)
    assert math.isnan(growth_exponent([0.0, 0.0, 1.0]))


def test_stochastic_rounding_is_unbiased() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.full((200_000,), 1.0 + 2.0**-10, dtype=torch.float32)  # a quarter ulp above 1
    nearest = round_to(x, torch.bfloat16, "nearest", gen).double().mean()
    stochastic = round_to(x, torch.bfloat16, "stochastic", gen).double().mean()
    assert float(nearest) == 1.0  # always down: a bias
    assert float(stochastic) == pytest.approx(1.0 + 2.0**-10, abs=2e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_shadow_run_tells_bias_from_noise(seed: int) -> None:
    torch.manual_seed(seed)
    model = model_zoo.TinyLM(VOCAB, n_layers=1)
    before = [p.detach().clone() for p in model.parameters()]
    batches = pattern_batches(VOCAB, 12, 4, 24, seed)
    biased = shadow_run(model, batches, "bf16", 1e-3, "nearest", seed=seed)
    unbiased = shadow_run(model, batches, "bf16", 1e-3, "stochastic", seed=seed)
    exact = shadow_run(model, batches, "fp32", 1e-3, "nearest", seed=seed)
    assert biased.exponent > 0.75, biased.exponent
    assert unbiased.exponent < 0.7, unbiased.exponent
    assert exact.exponent < 0.7 and exact.relative_final < 1e-6
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


# --- model-level audit --------------------------------------------------------------------


class Scaled(nn.Module):
    """A one-block zoo model whose head sees `a` times the hidden state, plus `offset` taken
    away again after the head (a cancellation), with logits multiplied by `b`."""

    def __init__(self, a: float = 1.0, b: float = 1.0, offset: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = model_zoo.TinyLM(VOCAB, n_layers=1)
        self.a, self.b, self.offset = a, b, offset

    def forward(self, idx):
        inner = self.inner
        h = inner.wte(idx) + inner.wpe(torch.arange(idx.shape[1]))
        z = inner.ln_f(inner.blocks[0](h)) * self.a  # (B, T, C)
        c = torch.full_like(z, self.offset)
        return (inner.head(z + c) - inner.head(c)) * self.b  # (B, T, V)


def test_clean_model_bf16_audit_quiet() -> None:
    model = model_zoo.make("sdpa", VOCAB)
    audit = audit_model_precision(model, VOCAB, 16, "bf16", lr=1e-3)
    assert {f.severity for f in audit.findings} <= {"info"}, [str(f) for f in audit.findings]
    assert max(audit.details["grad_relative_error"].values()) < 0.1


def test_fp16_overflow_is_an_error() -> None:
    audit = audit_model_precision(Scaled(a=1e5, b=1e-5), VOCAB, 8, "fp16")
    assert "N104" in codes(audit.findings)
    clean = audit_model_precision(Scaled(), VOCAB, 8, "fp16", master_weights="fp32")
    assert {f.severity for f in clean.findings} <= {"info"}, [str(f) for f in clean.findings]


def test_fp16_underflow_warns() -> None:
    audit = audit_model_precision(Scaled(b=1e-9), VOCAB, 8, "fp16")
    assert "N105" in codes(audit.findings)
    assert audit.details["grad_underflow_fraction"] > 0.01


def test_bf16_gradient_error_warns_for_a_sensitive_model() -> None:
    # head(z + 300) - head(300): bf16 rounds z + 300 to multiples of 2, wiping out z.
    audit = audit_model_precision(Scaled(offset=300.0), VOCAB, 8, "bf16")
    assert "N103" in codes(audit.findings)
    assert "N103" not in codes(audit_model_precision(Scaled(), VOCAB, 8, "bf16").findings)


def test_update_swallowing_severity_follows_master_weights() -> None:
    model = model_zoo.make("sdpa", VOCAB)  # embeddings ~ N(0, 1): half an ulp ~ 2^-9
    low = audit_model_precision(model, VOCAB, 8, "bf16", lr=1e-4, master_weights="bf16")
    (f,) = [f for f in low.findings if f.code == "N106"]
    assert f.severity == "warning"
    master = audit_model_precision(model, VOCAB, 8, "bf16", lr=1e-4, master_weights="fp32")
    (g,) = [g for g in master.findings if g.code == "N106"]
    assert g.severity == "info"
    big = audit_model_precision(model, VOCAB, 8, "bf16", lr=1e-1, master_weights="bf16")
    assert "N106" not in codes(big.findings)


def test_audit_leaves_model_untouched() -> None:
    model = model_zoo.make("batch_stats_over_time", VOCAB)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    audit_model_precision(model, VOCAB, 8, "bf16", shadow_steps=3)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


# --- CLI ----------------------------------------------------------------------------------


def test_cli_check_precision_json_and_exit_status() -> None:
    bad = invoke_cli(
        "check-precision",
        "--dtype",
        "bf16",
        "--world-size",
        "512",
        "--elements",
        "512",
        "--shadow-steps",
        "12",
        "--json",
    )
    assert bad.returncode == 1, bad.stderr
    payload = json.loads(bad.stdout)
    assert payload["ok"] is False and "N101" in {f["code"] for f in payload["findings"]}
    assert payload["reduction"]["slope"] < 0.999
    assert set(payload["shadow"]) == {"nearest", "stochastic"}
    usage = invoke_cli("check-precision", "--dtype", "fp8", "--json")
    assert usage.returncode == 2 and "fix:" in usage.stderr
