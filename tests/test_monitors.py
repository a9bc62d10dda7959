"""Detectors on synthetic curves: planted faults raise exactly their code at the right step;
clean curves (smooth, noisy, heavy-tailed, warm-up, cosine schedule) and degenerate input
raise nothing; state survives a round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trainguard.guard.config import MonitorsConfig
from trainguard.guard.detectors import synthetic as S
from trainguard.guard.detectors.monitor_set import MonitorSet
from trainguard.guard.detectors.oscillation import find_wave, match_data_period
from trainguard.guard.detectors.window import RollingWindow

N = 2000


def run(loss=None, grad=None, tps=None, steps=None, ms=None, **kw):
    """Feed the series through a fresh MonitorSet; all findings, finalize included."""
    n = len(next(x for x in (loss, grad, tps) if x is not None))
    steps = np.arange(n) if steps is None else steps
    ms = ms or MonitorSet(**kw)
    out = []
    for i in range(n):
        m = {}
        if loss is not None:
            m["loss"] = float(loss[i])
        if grad is not None:
            m["grad_norm"] = float(grad[i])
        if tps is not None:
            m["tokens_per_s"] = float(tps[i])
        out += ms.update(int(steps[i]), m)
    return out + ms.finalize()


def codes(findings):
    return [f.code for f in findings]


CLEAN = {
    "smooth": dict(noise=0.0),
    "gaussian": dict(noise=0.02),
    "gaussian-5pct": dict(noise=0.05),
    "heavy-tailed": dict(noise=0.02, heavy_tails=True),
    "warmup": dict(noise=0.02, warmup=100),
    "warmup-smooth": dict(noise=0.0, warmup=50),
    "warmup-cosine-heavy": dict(noise=0.02, warmup=100, cosine=True, heavy_tails=True),
    "cosine-low-noise": dict(noise=0.005, cosine=True),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(CLEAN))
def test_clean_curves_raise_nothing(name, seed):
    loss = S.clean_loss(N, seed=seed, **CLEAN[name])
    found = run(loss, S.clean_grad_norm(N, seed=seed + 10), S.clean_throughput(N, seed=seed + 20))
    assert found == [], [str(f) for f in found]


@pytest.mark.parametrize("at,factor", [(300, 2.0), (1200, 1.5), (1900, 3.0)])
def test_loss_spike(at, factor):
    loss = S.clean_loss(N, seed=5, noise=0.02, warmup=50)
    loss[at] *= factor
    found = run(loss)
    assert codes(found) == ["R102"]
    assert found[0].step == at and found[0].metric == "loss"
    assert found[0].data["ratio"] == pytest.approx(factor, rel=0.1)


def test_grad_norm_spike():
    grad = S.clean_grad_norm(N, seed=3)
    grad[800] *= 5
    found = run(S.clean_loss(N, seed=3), grad)
    assert codes(found) == ["R103"]
    assert found[0].step == 800 and found[0].metric == "grad_norm"


@pytest.mark.parametrize("metric", ["loss", "grad_norm"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite(metric, bad):
    loss, grad = S.clean_loss(300, seed=1), S.clean_grad_norm(300)
    (loss if metric == "loss" else grad)[150] = bad
    found = run(loss, grad)
    assert codes(found) == ["R101"]
    assert found[0].step == 150 and found[0].metric == metric


def test_non_finite_at_first_step():
    loss = S.clean_loss(10)
    loss[0] = math.nan
    assert [(f.code, f.step) for f in run(loss)] == [("R101", 0)]


@pytest.mark.parametrize("start", [400, 1200])
def test_divergence(start):
    loss = S.plant_divergence(S.clean_loss(N, seed=2, noise=0.02, warmup=50), start)
    found = run(loss[: start + 400])
    assert codes(found) == ["R104"]
    f = found[0]
    # The smoothed loss needs ~25 steps to rise 10% at 0.4%/step, plus the patience and lag.
    assert start < f.step <= start + 120
    assert start - 10 <= f.data["since_step"] <= f.step


@pytest.mark.parametrize("period", [20, 50, 100, 200])
def test_wave_period_and_data_period_match(period):
    loss = S.plant_wave(S.clean_loss(N, seed=4, noise=0.02, warmup=50), period, 0.02)
    found = run(loss, data_period=period)
    assert set(codes(found)) == {"R105"}
    f = found[0]
    assert f.data["period_steps"] == pytest.approx(period, rel=0.1)
    assert f.data["matches_data_period"] is True
    assert 0.01 < f.data["amplitude"] < 0.04


def test_wave_not_matching_a_different_data_period():
    loss = S.plant_wave(S.clean_loss(N, seed=4, noise=0.02), 64, 0.02)
    found = run(loss, data_period=170)  # 170, 85, 56.7, 42.5: none within 10% of 64
    assert codes(found) == ["R105"]
    assert found[0].data["matches_data_period"] is False


def test_wave_from_rows_logged_every_ten_steps():
    # 600 rows logged every 10 steps; the wave has a period of 300 steps (30 rows).
    rows = 600
    steps = np.arange(rows) * 10
    t = steps.astype(float)
    loss = (2.0 + 8.0 * (t + 1) ** -0.5) * (1 + 0.02 * np.sin(2 * np.pi * t / 300))
    loss *= 1 + np.random.default_rng(0).normal(0, 0.01, rows)
    found = run(loss, steps=steps, data_period=300)
    assert codes(found) == ["R105"]
    assert found[0].data["period_steps"] == pytest.approx(300, rel=0.1)


def test_throughput_drop():
    tps = S.clean_throughput(N, seed=7)
    tps[1000:1200] *= 0.5
    found = run(tps=tps)
    assert codes(found) == ["R106"]
    cfg = MonitorsConfig()
    assert found[0].step == 1000 + cfg.throughput_patience - 1


def test_throughput_single_slow_steps_are_quiet():
    tps = S.clean_throughput(N, seed=8)
    tps[500] *= 0.1  # a checkpoint write
    tps[900:903] *= 0.2  # an evaluation: shorter than the patience
    assert run(tps=tps) == []


DEGENERATE = {
    "constant": np.full(500, 2.5),
    "zeros": np.zeros(500),
    "one-row": np.array([3.0]),
    "two-rows": np.array([3.0, 2.9]),
    "three-rows": np.array([3.0, 2.9, 3.1]),
    "sparse-zeros": np.where(np.isin(np.arange(1500), [90, 400, 401, 777, 1300]), 0.0,
                             S.clean_loss(1500, seed=1)),
    "negative-decreasing": -1.0 - np.sqrt(np.arange(1500.0)) * (1 + 0.01 *
                            np.random.default_rng(0).normal(size=1500)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DEGENERATE))
def test_degenerate_input_is_quiet(name):
    x = DEGENERATE[name]
    assert run(x, x.copy(), np.abs(x) * 1000) == []


def test_gaps_and_repeated_steps_are_quiet():
    loss = S.clean_loss(1500, seed=9)
    steps = np.arange(1500) * 3
    steps[700:] += 500  # a gap
    steps[1000:1010] = steps[990:1000]  # steps replayed after a rollback
    assert run(loss, steps=steps) == []


def test_state_round_trip_gives_the_same_findings():
    loss = S.plant_wave(S.clean_loss(N, seed=6, noise=0.02), 80, 0.02)
    loss[1500] *= 2.0
    grad = S.clean_grad_norm(N, seed=6)
    grad[1700] = math.nan
    tps = S.clean_throughput(N, seed=6)
    tps[1800:1900] *= 0.4
    whole = run(loss, grad, tps)
    assert sorted(set(codes(whole))) == ["R101", "R102", "R105", "R106"]

    first = MonitorSet()
    out = []
    for i in range(1000):
        out += first.update(i, {"loss": loss[i], "grad_norm": grad[i], "tokens_per_s": tps[i]})
    state = json.loads(json.dumps(first.state_dict()))  # must be JSON-able, like a checkpoint
    second = MonitorSet()
    second.load_state_dict(state)
    for i in range(1000, N):
        out += second.update(i, {"loss": loss[i], "grad_norm": grad[i], "tokens_per_s": tps[i]})
    out += second.finalize()
    assert [(f.code, f.step, f.metric) for f in out] == [(f.code, f.step, f.metric) for f in whole]


def test_rolling_window_matches_numpy():
    rng = np.random.default_rng(0)
    w = RollingWindow(17)
    xs = rng.normal(size=200)
    for i, x in enumerate(xs):
        w.push(float(x))
        ref = xs[max(0, i - 16) : i + 1]
        assert w.median() == pytest.approx(np.median(ref))
        assert w.quantile(0.25) == pytest.approx(np.quantile(ref, 0.25))


def test_find_wave_is_none_on_white_noise_and_short_input():
    rng = np.random.default_rng(1)
    steps = np.arange(800.0)
    assert find_wave(steps, 3.0 + rng.normal(0, 0.05, 800), 1e-6) is None
    assert find_wave(steps[:50], 3.0 + rng.normal(0, 0.05, 50), 1e-6) is None


def test_match_data_period_harmonics():
    assert match_data_period(100.0, None) == (None, None)
    assert match_data_period(98.0, 100) == (True, 1)
    assert match_data_period(50.0, 100) == (True, 2)
    assert match_data_period(70.0, 100) == (False, None)


def test_throughput_on_a_noisy_shared_machine_is_quiet():
    # Tokens/s swinging +-40% step to step (an oversubscribed CPU): a 30% dip is noise there.
    rng = np.random.default_rng(11)
    tps = 600.0 * np.exp(rng.normal(0.0, 0.4, N))
    assert run(tps=tps) == []
    tps[1000:1100] *= 0.1  # a collapse is still caught
    assert codes(run(tps=tps)) == ["R106"]


FAINT_N = 5000


def faint_wave_case(seed: int) -> tuple[np.ndarray, float]:
    """A 0.5% wave with a period in 30-100 steps on a noisy (2%) decreasing curve."""
    period = float(np.random.default_rng(1000 + seed).uniform(30, 100))
    base = S.clean_loss(
        FAINT_N, seed=seed, noise=0.02, warmup=100, cosine=bool(seed % 2), heavy_tails=seed % 3 == 0
    )
    return S.plant_wave(base, period, 0.005), period


@pytest.mark.parametrize("seed", range(12))
def test_faint_wave_is_found_and_its_period_named(seed):
    """One window's periodogram cannot see it (the single-window test misses most such curves
    in benchmarks/bench_wave.py: 87% at 5000 steps since its noise level is local, a third with
    Fisher's g before); the periodogram of the last blocks joined does."""
    loss, period = faint_wave_case(seed)
    found = run(loss)
    assert codes(found) == ["R105"], [str(f) for f in found]
    f = found[0]
    assert f.data["period_steps"] == pytest.approx(period, rel=0.05)
    assert f"period of {f.data['period_steps']:.1f} steps" in f.message
    assert 0.003 < f.data["amplitude"] < 0.008


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", sorted(CLEAN))
def test_long_clean_curves_raise_no_wave(name, seed):
    """The faint-wave test joins up to 4096 rows: long clean curves, with the warm-up's and the
    cosine schedule's bends in them, stay quiet."""
    loss = S.clean_loss(6000, seed=100 + seed, **CLEAN[name])
    assert run(loss) == []


def test_faint_wave_state_round_trip_gives_the_same_finding():
    loss, _ = faint_wave_case(3)
    whole = run(loss)
    first = MonitorSet()
    out = []
    for i in range(2700):  # mid-block: rows of an unfinished block are in the state
        out += first.update(i, {"loss": loss[i]})
    second = MonitorSet()
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for i in range(2700, FAINT_N):
        out += second.update(i, {"loss": loss[i]})
    out += second.finalize()
    assert [f.to_dict() for f in out] == [f.to_dict() for f in whole]
    assert codes(whole) == ["R105"]


@pytest.mark.parametrize(
    "seed, kw",
    [
        (5033, dict(noise=0.02, warmup=100)),
        (5071, dict(noise=0.02, warmup=100, cosine=True, heavy_tails=True)),
    ],
)
def test_warmup_misfit_piled_in_one_third_is_not_a_wave(seed, kw):
    """Two of 3,600 clean curves of benchmarks/bench_wave.py raised R105 at the first full
    window: the warm-up's misfit at the lowest frequency, 1.8x its share in the first third."""
    assert run(S.clean_loss(FAINT_N, seed=seed, **kw)) == []
