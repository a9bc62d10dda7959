"""The real collective: gloo all_reduce with 2 and 4 local processes, and DDP with
`fp32_accumulate_hook`, measured against float64 like the simulation."""

from __future__ import annotations

import pytest
import torch

from trainguard.checks.precision_collective import check_collective, collective_results
from trainguard.numerics import fit_bias_noise, simulate_gradients

N = 2048


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_bf16_all_reduce_and_fp32_hook(world: int) -> None:
    results = collective_results(world, "bf16", N, seed=world)
    x = simulate_gradients(world, N, torch.bfloat16, seed=world)
    exact = x.double().sum(0)
    native = results["all_reduce"]
    # The native collective really sums in bf16: it differs from float64, by rounding only.
    slope, noise = fit_bias_noise(native, exact)
    assert 1e-4 < noise < 1e-2 and abs(1 - slope) < 1e-3
    if world == 2:
        # Two terms: one rounding, whatever the algorithm: bitwise the emulated bf16 add.
        assert torch.equal(native, (x[0] + x[1]).double())
    # fp32 accumulation (the function and the DDP hook): one rounding of the fp32 sum.
    want = x.float().sum(0).to(torch.bfloat16).double()
    for method in ("fp32-accumulate", "ddp-fp32-hook"):
        got = results[method]
        assert (got != want).double().mean() < 0.01, method  # fp32 sum order may flip a tie
        s, n = fit_bias_noise(got, exact)
        assert abs(1 - s) < 1e-3 and n < 2.0**-8


def test_gloo_fp32_collective_passes_the_audit() -> None:
    findings, audits = check_collective("fp32", (2, 4), N, ddp=False)
    assert findings == []
    assert {a.algorithm for a in audits} == {"all_reduce", "fp32-accumulate"}
    assert {a.world_size for a in audits} == {2, 4}
    assert all(a.source == "gloo" and a.bias < 1e-6 for a in audits)
