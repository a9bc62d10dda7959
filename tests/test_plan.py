"""`trainguard plan` (issue 24, item 3): the goodput model in closed form, the simulation that
checks it, the interval it recommends, the JSON contract, and the costs read from a run dir."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from trainguard.cli import app
from trainguard.goodput import model, simulate
from trainguard.goodput.model import Costs

HOUR = 3600.0
SYNC = Costs(step_s=1.0, stall_s=10.0, write_s=10.0, restart_s=60.0)  # interval >> costs
ASYNC = Costs(step_s=1.0, stall_s=0.5, write_s=30.0, restart_s=60.0)  # write 60x the stall
CONTRACT = ("--step-time", "2", "--checkpoint-stall", "5", "--restart", "600")
CONTRACT += ("--gpus", "16384", "--gpu-mtbf-hours", "50000", "--cycles", "20000", "--json")


def plan_json(*args: str) -> dict:
    res = CliRunner().invoke(app, ["plan", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def within_ci(sim: simulate.Simulated, value: float, se_count: float = 4.0) -> bool:
    se = (sim.ci95[1] - sim.ci95[0]) / (2 * simulate.Z95)
    return abs(sim.ettr - value) <= se_count * se


# --- the simulation against the closed form --------------------------------------------------


@pytest.mark.parametrize("costs", [SYNC, ASYNC], ids=["sync", "async"])
def test_simulation_agrees_with_the_closed_form(costs: Costs) -> None:
    """Over 50,000 simulated failures (seed 0) the simulated ETTR and each loss share are
    within 4 standard errors, and 0.002, of the closed form at the optimum, a third of it and
    three times it; failures during an asynchronous write included."""
    mtbf = 3 * HOUR
    draws = simulate.draw(costs, mtbf, 50_000, seed=0)
    best = model.best_interval(costs, mtbf)
    for k in (max(best // 3, 1), best, best * 3):
        sim = simulate.simulate(costs, k, draws)
        closed = model.expected_at(costs, k, mtbf)
        assert within_ci(sim, closed.ettr), (k, sim, closed)
        assert abs(sim.ettr - closed.ettr) < 2e-3
        for name in model.LOSSES:
            assert abs(sim.losses[name] - closed.losses[name]) < 2e-3, (k, name)


def test_closed_form_is_young_dalys_first_order_where_failures_are_rare() -> None:
    """Sync saves, an interval far above the stall and far below the MTBF: the exact model and
    the simulation agree with the textbook first-order waste, stall/P + (restart + P/2)/M,
    within 0.002 (its neglected terms are of order (P/M)^2)."""
    mtbf = 3 * HOUR
    k = model.to_steps(model.young_tau_s(SYNC.stall_s, mtbf), SYNC.step_s)
    P = k * SYNC.step_s + SYNC.stall_s
    first_order = 1 - SYNC.stall_s / P - (SYNC.restart_s + P / 2) / mtbf
    sim = simulate.simulate(SYNC, k, simulate.draw(SYNC, mtbf, 50_000, seed=1))
    assert abs(model.expected_at(SYNC, k, mtbf).ettr - first_order) < 2e-3
    assert abs(sim.ettr - first_order) < 2e-3


def _event_loop(costs: Costs, k: int, up_s: float) -> tuple[float, float, float]:
    """(kept, stall, lost) of one cycle, walked save by save: the reference for the vectorised
    timeline arithmetic."""
    T, d, w = k * costs.step_s, costs.stall_s, costs.write_s
    now, kept_state, durable_state, write_done, trained, stall = 0.0, 0.0, 0.0, None, 0.0, 0.0
    while True:
        # train T (the state grows), unless the failure comes first
        if now + T > up_s:
            trained += up_s - now
            break
        now += T
        trained += T
        # the save waits for the previous write, then stalls d; durable w after its start
        if write_done is not None and write_done > now:
            if write_done > up_s:
                stall += up_s - now
                break
            stall += write_done - now
            now = write_done
        if write_done is not None:
            durable_state = kept_state  # the previous save's state is durable by now
        kept_state = trained
        write_done = now + w
        if now + d > up_s:
            stall += up_s - now
            break
        now += d
        stall += d
    if write_done is not None and write_done <= up_s:
        durable_state = kept_state
    return durable_state, stall, trained - durable_state


@pytest.mark.parametrize("costs", [SYNC, ASYNC], ids=["sync", "async"])
def test_timeline_matches_a_save_by_save_event_loop(costs: Costs) -> None:
    mtbf = 20 * 60.0  # short: many failures land in saves and writes
    draws = simulate.draw(costs, mtbf, 400, seed=3)
    for k in (1, 7, 25, 80):
        kept, stall, lost = simulate.cycle_times(costs, k, draws.up_s)
        for i, up in enumerate(draws.up_s):
            ref = _event_loop(costs, k, float(up))
            assert np.allclose((kept[i], stall[i], lost[i]), ref, atol=1e-6), (k, up, ref)


def test_simulated_optimum_is_near_young_daly() -> None:
    """The best of the simulated sweep (common draws for every interval) is within a factor
    1.5 of Young/Daly's interval, and no interval of the sweep beats Young/Daly's by more than
    the simulation's own noise."""
    mtbf = 3 * HOUR
    young = model.to_steps(model.young_tau_s(SYNC.stall_s, mtbf), SYNC.step_s)
    draws = simulate.draw(SYNC, mtbf, 50_000, seed=2)
    ks = sorted({max(1, round(young * 2.0**e)) for e in np.linspace(-3, 3, 25)})
    sims = simulate.sweep(SYNC, ks, draws)
    best = max(sims, key=lambda s: s.ettr)
    assert young / 1.5 <= best.interval_steps <= young * 1.5, (young, best.interval_steps)
    at_young = simulate.simulate(SYNC, young, draws)
    assert best.ettr - at_young.ettr < 1e-3
    assert ks[0] < young / 4 and ks[-1] > young * 4  # the sweep did cover both sides


# --- the command ---------------------------------------------------------------------------


def test_json_contract() -> None:
    out = plan_json(*CONTRACT)
    assert out["ok"] is True and out["findings"] == []
    mtbf = 50000 * HOUR / 16384
    young = model.to_steps(model.young_tau_s(5.0, mtbf), 2.0)
    assert out["interval_steps"] == young and out["interval_source"] == "young-daly"
    assert out["interval_s"] == pytest.approx(young * 2.0)
    assert 0 < out["ettr"] < 1
    assert set(out["losses"]) == {"checkpoint_stall", "lost_work", "restart"}
    assert sum(out["losses"].values()) == pytest.approx(1 - out["ettr"])
    assert out["dominant_loss"] == max(out["losses"], key=out["losses"].get)
    assert out["job_mtbf_hours"] == pytest.approx(50000 / 16384)
    sim = out["simulation"]
    assert sim["interval_steps"] == young and sim["agrees"] is True
    assert sim["ci95"][0] <= sim["ettr"] <= sim["ci95"][1]
    assert {i["source"] for i in out["inputs"].values()} == {"flag", "assumed"}
    assert out["inputs"]["checkpoint_write_s"] == {
        "value": 5.0,
        "source": "assumed",
        "note": out["inputs"]["checkpoint_write_s"]["note"],
    }


def test_default_failure_rate_is_llama3s_and_named() -> None:
    args = [a for a in CONTRACT if a not in ("--gpu-mtbf-hours", "50000")]
    out = plan_json(*args)
    assert out["failure_model"]["gpu_mtbf_hours"] == pytest.approx(16384 * 54 * 24 / 419)
    assert "Llama 3" in out["failure_model"]["source"]
    assert "419" in out["failure_model"]["source"]
    assert out["inputs"]["gpu_mtbf_hours"]["source"] == "default"


def test_same_seed_same_output_and_the_seed_matters() -> None:
    a, b = plan_json(*CONTRACT), plan_json(*CONTRACT)
    assert a == b
    c = plan_json(*CONTRACT, "--seed", "7")
    assert c["simulation"]["ettr"] != a["simulation"]["ettr"]
    assert c["ettr"] == a["ettr"]  # the closed form draws nothing


def test_slow_write_is_weighed_and_young_daly_overruled() -> None:
    """An async save whose write takes 240x its stall: Young's interval would make every save
    wait for the previous write; the plan says so (R703) and takes the model's optimum, which
    the simulation confirms."""
    args = ("--step-time", "1", "--checkpoint-stall", "0.05", "--checkpoint-write", "120")
    out = plan_json(*args, "--restart", "300", "--gpus", "16384", "--cycles", "20000", "--json")
    assert [f["code"] for f in out["findings"]] == ["R703"]
    assert out["interval_source"] == "model-optimum"
    assert out["interval_steps"] > out["young_daly"]["young_steps"]
    assert out["ettr"] > out["young_daly"]["ettr"] + 0.1
    sweep = {s["interval_steps"]: s["ettr"] for s in out["simulation"]["sweep"]}
    assert sweep[out["interval_steps"]] > sweep[out["young_daly"]["young_steps"]]


def test_a_current_interval_whose_saves_wait_is_named() -> None:
    """`--interval 100` (200 s of training) with a 345 s write: every save waits 140 s for the
    previous one (R701 names that interval), and its ETTR is below the plan's."""
    args = ("--step-time", "2", "--checkpoint-stall", "5", "--checkpoint-write", "345")
    out = plan_json(*args, "--restart", "600", "--gpus", "16384", "--interval", "100", "--json")
    r701 = [f for f in out["findings"] if f["code"] == "R701"]
    assert [f["data"]["interval_steps"] for f in r701] == [100]
    assert "waits 140 s" in r701[0]["message"]
    assert out["current"]["interval_steps"] == 100
    assert out["current"]["ettr"] < out["ettr"]
    assert out["current"]["losses"]["checkpoint_stall"] > out["losses"]["checkpoint_stall"]


def test_failures_outpacing_progress_warn() -> None:
    args = ("--step-time", "1", "--checkpoint-stall", "30", "--restart", "1200")
    out = plan_json(*args, "--gpus", "100000", "--gpu-mtbf-hours", "20000", "--json")
    assert "R702" in [f["code"] for f in out["findings"]]
    assert out["ettr"] < 0.5 and out["dominant_loss"] == "restart"


def test_run_dir_gives_the_measured_numbers(finished_tiny_run: Path) -> None:
    rows = [json.loads(line) for line in (finished_tiny_run / "metrics.jsonl").open()]
    steps = [r for r in rows if r.get("kind") == "step"]
    out = plan_json("--run", str(finished_tiny_run), "--restart", "3.6", "--gpus", "64", "--json")
    inputs = out["inputs"]
    assert inputs["step_time_s"]["source"] == "run"
    assert inputs["step_time_s"]["value"] == pytest.approx(
        statistics.median(r["step_time_s"] for r in steps)
    )
    assert inputs["checkpoint_stall_s"]["source"] == "run"
    assert inputs["checkpoint_stall_s"]["value"] > 0
    assert inputs["restart_s"] == {"value": 3.6, "source": "flag"}
    assert inputs["gpus"] == {"value": 64.0, "source": "flag"}
    assert out["current"]["interval_steps"] == 4  # the tiny recipe's checkpoint.interval
    assert out["run"] == str(finished_tiny_run)
    # A flag wins over the measurement.
    over = plan_json(
        "--run", str(finished_tiny_run), "--restart", "3.6", "--step-time", "0.5", "--json"
    )
    assert over["inputs"]["step_time_s"] == {"value": 0.5, "source": "flag"}
    assert over["inputs"]["gpus"]["source"] == "run"  # the run's world size, 1


def test_stall_is_the_extra_time_after_checkpoint_steps(tmp_path: Path) -> None:
    """Steps end every 1.0 s, 3.5 s after a checkpoint step (every 4): the stall is 2.5 s.
    Neither the evaluation after step 5 nor the two resumes from checkpoints 4 and 8 (100 s each,
    the findings a resume logs before its first step) count as stalls, though a resume always
    follows a checkpoint step."""
    from trainguard.goodput.measure import measure_run

    (tmp_path / "recipe.yaml").write_text("checkpoint:\n  interval: 4\n")
    rows, t = [{"kind": "event", "step": 0, "event": "start", "env": {"world_size": 2}}], 0.0
    for s in range(13):  # steps count from 0; checkpoints after steps 3, 7, 11
        t += 3.5 if s % 4 == 0 and s > 0 else 1.0
        if s == 6:
            t += 9.0  # after the evaluation of 6 steps done
        if s in (4, 8):  # killed after the save, resumed from it
            rows.append({"kind": "finding", "code": "C150", "step": s})
            t += 100.0
        rows.append({"kind": "step", "step": s, "step_time_s": 0.8, "time": t})
        if s == 5:
            rows.append({"kind": "eval", "step": 6})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run.json").write_text('{"schema_version": 2}')  # rows counted from 0
    m = measure_run(tmp_path)
    assert m.stall_s == pytest.approx(2.5)
    assert m.step_s == pytest.approx(0.8)
    assert m.gpus == 2 and m.interval_steps == 4


def test_plots_are_written(tmp_path: Path) -> None:
    out = plan_json(*CONTRACT, "--out", str(tmp_path / "plots"))
    assert sorted(Path(p).name for p in out["plots"]) == [
        "ettr_vs_gpus.png",
        "ettr_vs_interval.png",
    ]
    for p in out["plots"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
