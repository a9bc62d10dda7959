"""MoE router health (R601-R604): the detector on a real MoE layer's router statistics, the
`Guard` API for users' loops, and `trainguard run` end to end (step rows, findings, report
plot) with a router forced onto one expert (`collapse@N`) and a clean MoE run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

import trainguard
from runhelpers import invoke_cli, tiny_recipe_dict
from trainguard.config.schema import MoEConfig
from trainguard.guard.config import MonitorsConfig
from trainguard.guard.detectors.moe import MoEHealthDetector, router_summary
from trainguard.model.moe import MoEFeedForward

MOE_CODES = {"R601", "R602", "R603", "R604"}
# Short patiences so a 30-step unit test sees every code.
FAST = MonitorsConfig(moe_patience=3, moe_dead_patience=5, moe_min_steps=3)


class OneLayer(torch.nn.Module):
    """A real MoE feed-forward, as the only module (`collect_router_stats` finds it)."""

    def __init__(self, router: str = "token_choice") -> None:
        super().__init__()
        torch.manual_seed(0)
        cfg = MoEConfig(n_experts=4, top_k=1, router=router)
        self.ffn = MoEFeedForward(16, cfg, seq_len=32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn(x)


def layer_stats(model: OneLayer, steps: int, forced_from: int | None = None) -> list[dict]:
    """Each step: a fresh random batch through the layer, the stats read and reset."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for step in range(1, steps + 1):
        if forced_from is not None and step >= forced_from:
            model.ffn.forced_expert = 0
        with torch.no_grad():
            model(torch.randn(4, 32, 16, generator=gen))
        out.append(trainguard.collect_router_stats(model, reset=True))
    return out


def codes_of(findings) -> list[str]:
    return [f.code for f in findings]


def test_collapsed_router_raises_every_moe_code_and_a_healthy_one_none() -> None:
    model = OneLayer()
    det, found = MoEHealthDetector(FAST), []
    for step, stats in enumerate(layer_stats(model, 30, forced_from=10), start=1):
        found += det.update(step, stats)
    by_code = {f.code: f for f in found}
    assert set(by_code) == MOE_CODES, codes_of(found)
    assert by_code["R603"].data == {"layer": "ffn", "experts": [0], "share": 1.0}
    assert {f.data["expert"] for f in found if f.code == "R602"} == {1, 2, 3}
    assert by_code["R601"].data["drop_frac"] > 0.5  # capacity 10 of 32 tokens per sequence
    assert all(f.step >= 10 for f in found)  # nothing before the fault

    healthy = MoEHealthDetector(FAST)
    quiet = [
        f for step, s in enumerate(layer_stats(OneLayer(), 30), 1) for f in healthy.update(step, s)
    ]
    assert quiet == []


def test_summary_columns_and_expert_choice_is_never_collapsed() -> None:
    (stats,) = layer_stats(OneLayer(), 1, forced_from=1)
    summary = router_summary(stats)
    assert summary["moe_load_max"] == 4.0 and summary["moe_load_min"] == 0.0
    assert summary["moe_drop_frac"] == pytest.approx(1 - 10 / 32)
    # expert_choice: every expert takes the same number of tokens, by construction.
    det = MoEHealthDetector(FAST)
    found = [f for i, s in enumerate(layer_stats(OneLayer("expert_choice"), 20, 1), 1)
             for f in det.update(i, s)]  # fmt: skip
    assert not {"R602", "R603", "R604"} & set(codes_of(found))


def test_detector_state_resumes_without_refiring() -> None:
    stats = layer_stats(OneLayer(), 30, forced_from=5)
    whole, a = MoEHealthDetector(FAST), MoEHealthDetector(FAST)
    expected = [f.code for i, s in enumerate(stats, 1) for f in whole.update(i, s)]
    got = [f.code for i, s in enumerate(stats[:15], 1) for f in a.update(i, s)]
    b = MoEHealthDetector(FAST)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # through JSON, as checkpoints
    got += [f.code for i, s in enumerate(stats[15:], 16) for f in b.update(i, s)]
    assert got == expected and "R602" in got


def test_guard_takes_router_stats_in_a_users_loop(tmp_path: Path) -> None:
    guard = trainguard.Guard(run_dir=tmp_path, config=trainguard.GuardsConfig(**FAST.model_dump()))
    codes = []
    for step, stats in enumerate(layer_stats(OneLayer(), 12, forced_from=3)):
        codes += codes_of(guard.step(step, loss=2.0, grad_norm=1.0, router_stats=stats).findings)
    assert "R603" in codes and "R601" in codes
    logged = [
        json.loads(line)["code"] for line in (tmp_path / "guard.jsonl").read_text().splitlines()
    ]
    assert "R603" in logged


def test_guard_device_path_reads_router_stats_at_read_back(tmp_path: Path) -> None:
    """`step_async` (no host sync in the step) takes a function that reads the counts; it is
    called when the step is read back, one step later, and the findings are the same."""
    stats = layer_stats(OneLayer(), 12, forced_from=3)
    config = trainguard.GuardsConfig(**FAST.model_dump(), decide_on="device")
    host, device = trainguard.Guard(config=config), trainguard.Guard(config=config)
    expected = [
        (f.step, f.code)
        for step, s in enumerate(stats)
        for f in host.step(step, loss=2.0, grad_norm=1.0, router_stats=s).findings
    ]
    calls, got = [], []
    for step, s in enumerate(stats):

        def read(s=s, step=step):
            calls.append(step)
            return s

        pending = device.step_async(step, loss=torch.tensor(2.0), grad_norm=1.0, router_stats=read)
        assert calls == list(range(step))  # this step's counts are not read yet
        if pending.resolved is not None:
            got += [(f.step, f.code) for f in pending.resolved.findings]
    got += [(f.step, f.code) for f in device.flush().findings]
    assert got == expected and "R603" in {c for _, c in got}


# --- trainguard run, end to end ---------------------------------------------------------------
STEPS = 40


def moe_run(
    tmp_path: Path, corpus: Path, cache: Path, inject: str = "", decide_on: str = "auto"
) -> tuple[list, Path]:
    d = tiny_recipe_dict(corpus, cache)
    d["model"]["moe"] = {"router": "token_choice", "n_experts": 4, "top_k": 1}
    # A gentle schedule: at the tiny recipe's 3e-3 with 2 warm-up steps this router really
    # collapses for a while (R601/R603 rightly fire), which is no clean baseline.
    d["train"] |= {"max_steps": STEPS, "lr": 1e-3, "warmup_steps": 10, "eval_interval": STEPS}
    d["checkpoint"]["interval"] = STEPS
    d["guards"] = {"moe_min_steps": 5, "decide_on": decide_on}
    recipe = tmp_path / "moe.yaml"
    recipe.write_text(yaml.safe_dump(d))
    run_dir = tmp_path / "run"
    env = {"TRAINGUARD_INJECT": inject} if inject else None
    res = invoke_cli("run", str(recipe), "--run-dir", str(run_dir), "-q", "--no-evals", env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, run_dir


# The device path (guards.decide_on=device: the counts read one step later) with the slow set.
@pytest.mark.parametrize("decide_on", ["host", pytest.param("device", marks=pytest.mark.slow)])
def test_run_with_a_collapsed_router_names_the_layers(
    tmp_path: Path, small_corpus: Path, cache_dir: Path, decide_on: str
) -> None:
    rows, run_dir = moe_run(tmp_path, small_corpus, cache_dir, "collapse@9", decide_on)
    found = [r for r in rows if r["kind"] == "finding" and r["code"] in MOE_CODES]
    assert {f["code"] for f in found} == MOE_CODES
    layers = {f["data"]["layer"] for f in found}
    assert layers == {"transformer.h.0.mlp", "transformer.h.1.mlp"}
    assert min(f["step"] for f in found) > 9  # steps count from 0
    steps = [r for r in rows if r["kind"] == "step"]
    assert all(r["moe_load_max"] == 4.0 for r in steps if r["step"] >= 9)
    assert 'alt="moe"' in (run_dir / "report.html").read_text()


def test_clean_moe_run_is_quiet_and_logs_router_columns(
    tmp_path: Path, small_corpus: Path, cache_dir: Path
) -> None:
    rows, run_dir = moe_run(tmp_path, small_corpus, cache_dir)
    codes = {r["code"] for r in rows if r["kind"] == "finding"}
    assert not codes & (MOE_CODES | {"R605"}), codes
    steps = [r for r in rows if r["kind"] == "step"]
    assert len(steps) == STEPS
    assert all({"moe_drop_frac", "moe_load_max", "moe_load_min", "data_time_s"} <= r.keys()
               for r in steps)  # fmt: skip
    assert max(r["moe_load_max"] for r in steps) < 4.0  # no step collapsed
    html = (run_dir / "report.html").read_text()
    assert 'alt="moe"' in html and 'alt="data phase"' in html


def test_dense_run_has_no_router_columns(tiny_run_copy: Path) -> None:
    rows = [json.loads(line) for line in (tiny_run_copy / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert steps and not any("moe_load_max" in r for r in steps)
    assert all(r["data_time_s"] >= 0 for r in steps)  # timed in one process too
