"""Data-loader stalls (R605): the data phase's share of the step, in `Guard` (explicit times or
`guard.phase("data", step)`) and in a single-process `trainguard run` with a planted slow
loader (`slowdata@N`: the data phase sleeps 0.5 s). Sleeps plant the fault; no test asserts a
wall-clock time, only which share the detector saw and that it named the loader."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import yaml

import trainguard
from runhelpers import invoke_cli, tiny_recipe_dict
from trainguard.cli.watch import watch_log
from trainguard.guard.config import MonitorsConfig
from trainguard.guard.detectors.loader import LoaderStallDetector


def r605(decisions) -> list:
    return [f for d in decisions for f in d.findings if f.code == "R605"]


def test_explicit_times_stall_and_clean() -> None:
    guard = trainguard.Guard()
    stalled = [
        guard.step(s, loss=2.0, grad_norm=1.0, data_time_s=0.6, step_time_s=1.0) for s in range(12)
    ]
    (finding,) = r605(stalled)  # once per episode
    assert finding.step == 9 and finding.data["share"] == 0.6 and "data loader" in finding.message
    clean = trainguard.Guard()
    assert not r605(
        clean.step(s, loss=2.0, grad_norm=1.0, data_time_s=0.02, step_time_s=1.0) for s in range(30)
    )


def test_one_slow_batch_is_not_a_stall_and_the_detector_rearms() -> None:
    det = LoaderStallDetector(MonitorsConfig(loader_window=5))
    shares = [0.05] * 10 + [0.9] + [0.05] * 10 + [0.8] * 5 + [0.05] * 5 + [0.8] * 5
    fired = [s for s, x in enumerate(shares) if det.update(s, x, 1.0)]
    assert fired == [23, 33]  # the single slow batch (step 10) never; each episode once


def test_guard_phase_times_the_data_phase_in_one_process() -> None:
    """A user's loop: `with guard.phase("data", step)` around getting the batch is enough."""
    batches = iter(torch.randn(64, 8).split(2))
    model = torch.nn.Linear(8, 1)

    def loop(guard: trainguard.Guard, data_sleep: float, compute_sleep: float) -> list:
        out = []
        for step in range(14):
            with guard.phase("data", step):
                time.sleep(data_sleep)  # the planted stall (or none)
                x = next(batches)
            time.sleep(compute_sleep)  # the step's compute
            loss = model(x).pow(2).mean()
            loss.backward()
            out.append(guard.step(step, loss=loss, model=model))
        return out

    stalled = r605(loop(trainguard.Guard(), data_sleep=0.2, compute_sleep=0.0))
    assert len(stalled) == 1 and stalled[0].data["share"] >= 0.4
    batches = iter(torch.randn(64, 8).split(2))
    assert not r605(loop(trainguard.Guard(), data_sleep=0.0, compute_sleep=0.05))


# The host path is the default run's representative; the device path's wiring (the step's time
# between step starts) runs with the slow set.
@pytest.mark.parametrize("decide_on", ["host", pytest.param("device", marks=pytest.mark.slow)])
def test_run_with_a_slow_loader_names_the_loader(
    tmp_path: Path, small_corpus: Path, cache_dir: Path, decide_on: str
) -> None:
    """Both of the run's paths: the guard deciding on the host, and on the device (no host
    sync in the step; the step's time is then the time between step starts)."""
    d = tiny_recipe_dict(small_corpus, cache_dir)
    d["train"] |= {"max_steps": 24, "eval_interval": 24}
    d["guards"] = {"decide_on": decide_on}
    d["checkpoint"]["interval"] = 24
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump(d))
    run_dir = tmp_path / "run"
    res = invoke_cli(
        "run", str(recipe), "--run-dir", str(run_dir), "-q", "--no-evals",
        env={"TRAINGUARD_INJECT": "slowdata@7"},  # steps count from 0
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    found = [r for r in rows if r["kind"] == "finding" and r["code"] == "R605"]
    # The median of 10 shares: once half the window is stalled (steps 7-11 and on), named once.
    # Not before the stall; one step early when a step before it was slow on a busy machine
    # (its share counts in the window too).
    assert len(found) == 1 and 7 <= found[0]["step"] <= 12, found
    assert found[0]["data"]["share"] >= 0.4 and found[0]["metric"] == "data_time_s"
    assert all("data_time_s" in r for r in rows if r["kind"] == "step")
    assert 'alt="data phase"' in (run_dir / "report.html").read_text()
    # `trainguard watch` over the run's log names the same stall from the step rows, once, in
    # the same window (the rows' step time is the whole step's, the guard's the step's compute).
    replayed = [f for f in watch_log(run_dir / "metrics.jsonl")[0] if f.code == "R605"]
    assert len(replayed) == 1 and abs(replayed[0].step - found[0]["step"]) <= 2, replayed


def test_clean_run_has_no_loader_finding(tiny_run_copy: Path) -> None:
    rows = [json.loads(line) for line in (tiny_run_copy / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if r["kind"] == "step"]) >= 10  # the detector's window
    assert not [r for r in rows if r.get("code") == "R605"]
    assert not [f for f in watch_log(tiny_run_copy / "metrics.jsonl")[0] if f.code == "R605"]
