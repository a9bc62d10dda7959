"""Scaling-law fit (Chinchilla approach 3), off-track alarm, gating-run grid and CLI."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize
from typer.testing import CliRunner

from trainguard.cli import app
from trainguard.errors import BadInputError, RunHalted
from trainguard.scaling.fit import (
    ScalingLaw,
    batched_objective,
    fit_scaling_law,
    init_grid,
    objective,
)
from trainguard.scaling.grid import parse_grid, read_runs_csv, run_grid
from trainguard.scaling.lbfgs import minimize_batched
from trainguard.scaling.offtrack import OffTrackMonitor, PredictionBand

# Besiroglu et al. 2024, the replication's fit of Chinchilla's data.
TRUTH = ScalingLaw(E=1.82, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)


def synthetic_runs(seed: int = 1, noise: float = 0.005, sizes: int = 5, budgets: int = 6):
    rng = np.random.default_rng(seed)
    n = np.repeat(np.geomspace(1e7, 3e9, sizes), budgets)
    d = np.tile(np.geomspace(3e8, 3e11, budgets), sizes)
    return n, d, TRUTH.predict(n, d) * np.exp(rng.normal(0.0, noise, n.size))


@pytest.fixture(scope="module")
def fitted():
    n, d, loss = synthetic_runs()
    return fit_scaling_law(n, d, loss, seed=0)


def test_recovers_besiroglu_constants(fitted):
    law = fitted.law
    assert fitted.converged and fitted.findings == []
    assert abs(law.E - 1.82) < 0.08
    assert law.alpha == pytest.approx(0.3478, abs=0.03)
    assert law.beta == pytest.approx(0.3658, abs=0.03)
    assert abs(math.log(law.A / 482.01)) < 0.4 and abs(math.log(law.B / 2085.43)) < 0.4


def test_bootstrap_band_covers_truth(fitted):
    # In range, and extrapolated to Chinchilla itself (70B params, 1.4T tokens).
    points = [(1e8, 1e10), (70e9, 1.4e12)]
    for p in fitted.predictions(points):
        true = float(TRUTH.predict(p["params"], p["tokens"]))
        assert p["low"] <= true <= p["high"], (p, true)
        assert p["low"] <= p["loss"] <= p["high"]
    assert fitted.boot.shape == (200, 5)


def test_noise_free_fit_is_exact():
    n, d, loss = synthetic_runs(noise=0.0)
    res = fit_scaling_law(n, d, loss, n_boot=0)
    assert res.converged
    np.testing.assert_allclose(res.law.predict(n, d), loss, rtol=1e-6)


def test_objective_is_summed_huber_with_exact_gradient():
    n, d, loss = synthetic_runs()
    args = (np.log(n), np.log(d), np.log(loss))
    theta = np.array([6.0, 7.5, 0.5, 0.33, 0.37])
    f, g = objective(theta, *args)
    r = np.log(TRUTH.from_theta(theta).predict(n, d)) - np.log(loss)
    huber = np.where(np.abs(r) <= 1e-3, 0.5 * r**2, 1e-3 * (np.abs(r) - 0.5e-3))
    assert f == pytest.approx(huber.sum(), rel=1e-10)  # summed, not averaged
    eps = 1e-6
    num = [
        (objective(theta + eps * e, *args)[0] - objective(theta - eps * e, *args)[0]) / (2 * eps)
        for e in np.eye(5)
    ]
    np.testing.assert_allclose(g, num, rtol=1e-4, atol=1e-9)
    assert init_grid().shape == (4500, 5)


def test_batched_lbfgs_matches_scipy():
    n, d, loss = synthetic_runs(seed=2)
    args = (np.log(n), np.log(d), np.log(loss))
    x0 = np.array([[5.0, 5.0, 0.5, 0.5, 0.5], [10.0, 10.0, 0.0, 0.5, 0.5]])
    res = minimize_batched(lambda x, _w: batched_objective(x, *args), x0)
    assert res.converged.all()
    for i, start in enumerate(x0):
        ref = minimize(
            objective,
            start,
            args=args,
            jac=True,
            method="L-BFGS-B",
            options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 5000},
        )
        assert res.f[i] <= ref.fun * (1 + 1e-6) + 1e-12


def test_stopped_early_is_e141():
    n, d, loss = synthetic_runs()
    res = fit_scaling_law(n, d, loss, n_boot=0, max_iter=2)
    assert [f.code for f in res.findings if f.code == "E141"] == ["E141"]
    assert not res.converged


def test_poorly_identified_is_e142_and_bad_input_raises():
    n, d, loss = synthetic_runs(sizes=1, budgets=8)
    res = fit_scaling_law(n, d, loss, n_boot=0)
    assert "E142" in {f.code for f in res.findings}
    with pytest.raises(BadInputError, match="cannot identify"):
        fit_scaling_law(n[:4], d[:4], loss[:4])
    with pytest.raises(BadInputError, match="non-positive"):
        fit_scaling_law([1e7] * 6, [1e9] * 6, [3.0, 3.0, -1.0, 3.0, 3.0, 3.0])


def _band(fitted, params=1e8, total=1e10):
    return PredictionBand.from_fit(fitted, params, total)


def test_offtrack_quiet_on_track_and_fires_off_track(fitted):
    band = _band(fitted)
    rng = np.random.default_rng(0)
    tokens = np.linspace(1e9, 1e10, 10)
    on = OffTrackMonitor(band)
    for i, t in enumerate(tokens):
        loss = float(TRUTH.predict(1e8, t)) * (1 + rng.normal(0, 0.003))
        assert on.update(i, {"val_loss": loss, "tokens": t}) == []
    high = OffTrackMonitor(band)
    found = [
        f
        for i, t in enumerate(tokens)
        for f in high.update(i, {"val_loss": float(TRUTH.predict(1e8, t)) * 1.15, "tokens": t})
    ]
    assert [f.code for f in found] == ["E151"]  # once, after patience, not every evaluation
    assert found[0].step == 5  # tokens reach half the budget at step 4; patience 2
    low = OffTrackMonitor(band)
    found = [
        f
        for i, t in enumerate(tokens)
        for f in low.update(i, {"val_loss": float(TRUTH.predict(1e8, t)) * 0.8, "tokens": t})
    ]
    assert [f.code for f in found] == ["E152"]


def test_offtrack_ignores_other_rows_and_round_trips(fitted):
    mon = OffTrackMonitor(_band(fitted), patience=2)
    assert mon.update(1, {"loss": 9.0}) == []
    assert mon.update(2, {"val_loss": float("nan"), "tokens": 9e9}) == []
    assert mon.update(3, {"val_loss": 9.0, "tokens": 9e9}) == []  # 1 of 2
    state = json.loads(json.dumps(mon.state_dict()))
    fresh = OffTrackMonitor(PredictionBand(1.0, [1.0, 2.0], [1.0] * 2, [1.0] * 2, [1.0] * 2))
    fresh.load_state_dict(state)
    assert [f.code for f in fresh.update(4, {"val_loss": 9.0, "tokens": 9.5e9})] == ["E151"]


@dataclass
class _Result:
    params: int
    tokens: int
    final_val_loss: float | None


def test_grid_writes_and_resumes_csv(tmp_path):
    """Grid plumbing with a stand-in for run_recipe (the real run is in the slow test)."""
    calls = []

    def fake_run(recipe, run_dir):
        calls.append(run_dir.name)
        if recipe.model.d_model == 24 and recipe.train.max_steps == 20:
            raise RunHalted("halted by a guard")
        n = recipe.model.d_model**2 * 12 * recipe.model.n_layers
        d = recipe.train.max_steps * recipe.train.batch_size * recipe.data.seq_len
        return _Result(n, d, float(TRUTH.predict(n, d)))

    axes = parse_grid(["model.d_model=16,24", "train.max_steps=10,20"])
    out = tmp_path / "runs"
    rows, findings = run_grid("default", axes, out, out / "runs.csv", runner=fake_run)
    assert len(calls) == 4 and len(rows) == 3
    assert [f.code for f in findings] == ["E161"]
    n, d, loss = read_runs_csv(out / "runs.csv")
    assert len(n) == 3 and np.allclose(loss, TRUTH.predict(n, d))
    calls.clear()
    rows, findings = run_grid("default", axes, out, out / "runs.csv", runner=fake_run)
    assert calls == ["d_model=24_max_steps=20"] and rows == []  # finished cells skipped
    with open(out / "runs.csv") as f:
        assert list(csv.DictReader(f))[0].keys() >= {"params", "tokens", "loss"}
    with pytest.raises(BadInputError):
        parse_grid(["model.d_model"])
    with pytest.raises(BadInputError, match="model.d_modle"):
        run_grid("default", parse_grid(["model.d_modle=1"]), out, out / "x.csv", runner=fake_run)


def test_cli_scale_fit_json_and_plot(tmp_path):
    n, d, loss = synthetic_runs()
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["params", "tokens", "loss"])
        w.writerows(zip(n, d, loss, strict=True))
    res = CliRunner().invoke(
        app,
        [
            "scale",
            "fit",
            str(path),
            "--predict",
            "70e9,1.4e12",
            "--boot",
            "50",
            "--plot",
            str(tmp_path / "fit.png"),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) == {"ok", "findings", "fit", "predictions", "plot"}
    assert set(out["fit"]) == {"E", "A", "B", "alpha", "beta"}
    (p,) = out["predictions"]
    assert set(p) == {"params", "tokens", "loss", "low", "high"} and p["low"] <= p["high"]
    assert Path(out["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The band for the big run, then its off-track alarm reading it back.
    res = CliRunner().invoke(
        app,
        [
            "scale",
            "fit",
            str(path),
            "--predict",
            "1e8,1e10",
            "--boot",
            "50",
            "--band",
            str(tmp_path / "band.json"),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    band = PredictionBand.load(json.loads(res.stdout)["band"])
    assert band.params == 1e8 and band.tokens[-1] == pytest.approx(1e10)
    mon = OffTrackMonitor(band, patience=1)
    assert mon.update(1, {"val_loss": float(TRUTH.predict(1e8, 1e10)), "tokens": 1e10}) == []
    assert [f.code for f in mon.update(2, {"val_loss": 9.0, "tokens": 1e10})] == ["E151"]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(BadInputError, match="unreadable"):
        PredictionBand.load(tmp_path / "bad.json")
    bad = CliRunner().invoke(app, ["scale", "fit", str(tmp_path / "none.csv")])
    assert bad.exit_code == 2
    bad = CliRunner().invoke(app, ["scale", "fit", str(path), "--predict", "70e9"])
    assert bad.exit_code == 2


def test_side_by_side_cells_report_their_failures_in_the_grids_order(tmp_path):
    """With jobs=2 the first cell fails last; its finding still comes first (it came in the
    order cells finished, so the same grid gave different JSON; found in review)."""
    import threading

    second_failed = threading.Event()

    def fake_run(recipe, run_dir):
        if recipe.model.d_model == 16:
            assert second_failed.wait(30)  # the first cell ends after the second
            raise RunHalted("first cell halted")
        second_failed.set()
        raise RunHalted("second cell halted")

    axes = parse_grid(["model.d_model=16,24"])
    out = tmp_path / "runs"
    _, findings = run_grid("default", axes, out, out / "runs.csv", runner=fake_run, jobs=2)
    assert ["first" in f.message for f in findings] == [True, False]
