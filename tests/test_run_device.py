"""`trainguard run` with the guard deciding on the device (guards.decide_on=device, what CUDA
gets by default) against the host path, on the CPU: the same faults (NaN and spike batches, a
transient bit flip that the rerun classifies, three bad batches in a row that roll back) give
the same metrics rows, the same findings and bitwise the same weights and optimizer state."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from runhelpers import tiny_recipe_dict
from trainguard.checkpoint.read import read_module_state
from trainguard.config.load import validate_recipe
from trainguard.faults import FaultPlan
from trainguard.train.guarded_run import run_recipe

# under pytest-xdist the module's tests run on one worker, so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_run_device")

FAULTS = "nan@4,spike@6,bitflip@9:exponent,nan@12,nan@13,nan@14"  # steps count from 0


def run(mode: str, corpus: Path, cache: Path, run_dir: Path) -> dict:
    raw = tiny_recipe_dict(corpus, cache)
    raw["train"] |= {"max_steps": 20, "eval_interval": 10}
    raw["guards"] = {"decide_on": mode, "spike_min_history": 4}
    recipe = validate_recipe(raw, "test")
    result = run_recipe(
        recipe, run_dir, progress=False, report=False, evals=False, faults=FaultPlan.parse(FAULTS)
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"result": result, "rows": rows}


@pytest.fixture(scope="module")
def both(small_corpus: Path, cache_dir: Path, tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("decide")
    modes = ("host", "device")
    return {m: run(m, small_corpus, cache_dir, base / m) | {"dir": base / m} for m in modes}


def steps(rows: list[dict]) -> list[tuple]:
    keep = ("step", "loss", "grad_norm", "lr", "batch_hash", "action")
    return [tuple(repr(r[k]) for k in keep) for r in rows if r["kind"] == "step"]


def findings(rows: list[dict]) -> list[tuple]:
    return sorted(
        (r["step"], r["code"], json.dumps(r["data"], sort_keys=True))
        for r in rows
        if r["kind"] == "finding" and r["code"] != "R106"  # throughput: timing, not faults
    )


def test_device_path_takes_the_host_paths_decisions(both: dict) -> None:
    host, device = both["host"], both["device"]
    assert steps(device["rows"]) == steps(host["rows"])
    assert findings(device["rows"]) == findings(host["rows"])
    acts = [(r["step"], r["action"]) for r in host["rows"] if r["kind"] == "step"]
    assert [s for s, a in acts if a != "apply"] == [4, 6, 12, 13]  # rollback steps: no row
    codes = {(s, c) for s, c, _ in findings(host["rows"])}
    # skips (NaN, spike), reruns (data; the bit flip: hardware), two rollbacks (R204)
    assert {(4, "R101"), (4, "R206"), (6, "R102"), (9, "R205"), (9, "R204")} <= codes
    assert {(14, "R204"), (14, "R202")} <= codes
    events = [r for r in host["rows"] if r.get("event") == "rollback"]
    # from the step being computed (0-based) to a checkpoint (completed steps)
    assert [(e["from_step"], e["to_step"]) for e in events] == [(9, 8), (14, 12)]
    assert math.isfinite(device["result"].final_val_loss)
    assert device["result"].final_val_loss == host["result"].final_val_loss


def test_device_path_ends_with_bitwise_the_same_weights_and_optimizer(both: dict) -> None:
    ckpt = {m: both[m]["dir"] / "checkpoints" / "step-20" for m in both}
    a, b = (read_module_state(ckpt[m]) for m in ("host", "device"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    oa, ob = (load_file(ckpt[m] / "state.safetensors") for m in ("host", "device"))
    optimizer = [k for k in oa if k.startswith("state['optimizer']")]
    assert optimizer and all(torch.equal(oa[k], ob[k]) for k in optimizer)
