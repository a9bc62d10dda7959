"""The real collective: gloo all_reduce with 2, 3 and 4 local processes (and under torchrun),
and DDP with `fp32_accumulate_hook`, measured against float64 like the simulation; the verdict
on whether a size can show the bias the simulation predicts at scale."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from runhelpers import run_cli
from trainguard.checks.precision_collective import check_collective, collective_results
from trainguard.checks.precision_reduction import scale_verdict, smallest_biased_size
from trainguard.numerics import fit_bias_noise, simulate_gradients
from trainguard.numerics.reduction import audit_reduction
from trainguard.train.launch import launch_argv

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


@pytest.mark.slow  # 10-15 s of `--nproc` jobs; the gloo measurement itself runs by default above
def test_cli_nproc_measures_any_size_and_says_when_it_is_too_small() -> None:
    """`--nproc 3`: three real processes (not a power of two), and the explicit verdict that 3
    ranks cannot show the bias the simulation predicts at 512."""
    res = run_cli(
        *("check-precision", "--dtype", "bf16", "--world-size", "512", "--elements", "512"),
        *("--nproc", "3", "--shadow-steps", "0", "--json"),
        "--oversubscribe",  # 3 processes on a 2-core machine: on purpose
    )
    assert res.returncode == 1, res.stderr  # the simulation at 512 ranks is biased (N101)
    payload = json.loads(res.stdout)
    coll = {a["algorithm"]: a for a in payload["collective"]}
    assert set(coll) == {"all_reduce", "fp32-accumulate", "ddp-fp32-hook"}
    assert {a["world_size"] for a in coll.values()} == {3}
    assert all(a["source"] == "gloo" and a["bias"] < 1e-3 for a in coll.values())
    assert 0 < coll["all_reduce"]["noise"] < 1e-2  # really summed in bf16: rounding, no bias
    (verdict,) = payload["collective_scale"]
    assert verdict["world_size"] == 3 and verdict["scale_world_size"] == 512
    assert verdict["shows_bias"] is False
    assert verdict["predicted_bias"] < 1e-3 < verdict["scale_bias"]
    assert 3 < verdict["smallest_showing"] <= 512
    assert "3 ranks are too small to show the bias" in verdict["verdict"]
    # Only the simulation's N101 (at 512 ranks): the real 3-rank collective is clean.
    assert [f["where"] for f in payload["findings"] if f["code"] == "N101"] == [
        "simulated ring, bf16, world size 512"
    ]


def test_scale_verdict_when_nothing_is_predicted_and_when_the_size_suffices() -> None:
    quiet = audit_reduction("bf16", 8, "ring", N, 0)
    assert not quiet.biased
    v = scale_verdict(4, quiet, N, 0)
    assert v["shows_bias"] is None and "predicts no bias" in v["verdict"]
    loud = audit_reduction("bf16", 512, "ring", N, 0)
    first = smallest_biased_size("bf16", "ring", 512, N, 0)
    assert first is not None and audit_reduction("bf16", first, "ring", N, 0).biased
    assert not audit_reduction("bf16", first // 2, "ring", N, 0).biased
    enough = scale_verdict(first, loud, N, 0)
    assert enough["shows_bias"] is True and "can show it" in enough["verdict"]


@pytest.mark.slow
def test_under_torchrun_every_rank_joins_and_rank_0_reports(tmp_path) -> None:
    """An external torchrun job of 3 ranks: the job's own group is measured, one JSON object."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [
            *launch_argv(3, ["check-precision", "--dtype", "bf16", "--world-size", "512"]),
            *("--elements", "512", "--shadow-steps", "0", "--json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert res.returncode in (0, 1), res.stderr  # rank 0's status: 1 (the simulated N101)
    payload = json.loads(res.stdout)
    assert {a["world_size"] for a in payload["collective"]} == {3}
    assert payload["collective_scale"][0]["shows_bias"] is False
