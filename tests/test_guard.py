"""The Guard in real PyTorch loops: bad updates are never applied, clean training is untouched,
escalation to rollback and halt, rerun classification, state, config."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from trainguard.errors import ConfigError, RunHalted
from trainguard.guard import core as guard_mod
from trainguard.guard.config import GuardsConfig
from trainguard.guard.core import Guard
from trainguard.guard.detectors import synthetic as S
from trainguard.guard.rerun import classify_rerun


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread; restore the process-wide setting afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(8, 1, generator=g)
    x = torch.randn(4096, 8, generator=g)
    y = x @ w_true + 0.1 * torch.randn(4096, 1, generator=g)
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt, x, y


def train(steps=300, inject=None, guard=None, seed=0):
    """A plain loop that calls guard.step before optimizer.step; returns the decisions and a
    snapshot of the parameters before/after each step."""
    model, opt, x, y = make_problem(seed)
    guard = guard or Guard()
    decisions, changed = [], []
    for step in range(steps):
        idx = torch.arange(step * 64, step * 64 + 64) % len(x)
        xb, yb = x[idx].clone(), y[idx].clone()
        if inject is not None:
            xb, yb = inject(step, xb, yb)
        before = [p.detach().clone() for p in model.parameters()]
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        d = guard.step(step, loss=loss, model=model, optimizer=opt)
        opt.step()  # unconditional on purpose: the guard cleared the grads of a bad step
        opt.zero_grad(set_to_none=True)
        decisions.append(d)
        changed.append(
            any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
        )
    return decisions, changed, model


def test_clean_training_is_untouched():
    decisions, changed, model = train()
    assert [f for d in decisions for f in d.findings] == []
    assert all(d.action == "apply" for d in decisions)
    assert all(changed)


def test_nan_batch_is_skipped_and_never_applied():
    def nan_at_120(step, xb, yb):
        if step == 120:
            xb[3, 2] = math.nan
        return xb, yb

    decisions, changed, model = train(inject=nan_at_120)
    d = decisions[120]
    assert d.action == "skip"
    assert [(f.code, f.metric) for f in d.findings] == [
        ("R101", "loss"),
        ("R101", "grad_norm"),
        ("R201", None),
    ]
    assert d.rerun is True
    assert changed[120] is False  # AdamW skipped every parameter: no gradient
    assert all(torch.isfinite(p).all() for p in model.parameters())
    others = [f for i, dd in enumerate(decisions) if i != 120 for f in dd.findings]
    assert others == []


def test_spike_batch_is_skipped():
    def spike_at_200(step, xb, yb):
        if step == 200:
            yb = yb * 30.0
        return xb, yb

    decisions, changed, _ = train(inject=spike_at_200)
    d = decisions[200]
    assert d.action == "skip"
    assert {f.code for f in d.findings} >= {"R102", "R201"}
    assert changed[200] is False
    assert all(dd.action == "apply" for i, dd in enumerate(decisions) if i != 200)


def feed(guard, loss, start=0):
    return [guard.step(start + i, loss=float(v)) for i, v in enumerate(loss)]


def test_repeated_spikes_roll_back_then_halt():
    loss = S.clean_loss(400, seed=1, noise=0.02)
    for at in (200, 210, 220, 300, 310, 320):
        loss[at] *= 3.0
    g = Guard(config=GuardsConfig(max_rollbacks=1))
    ds = feed(g, loss)
    acts = {i: d.action for i, d in enumerate(ds) if d.action != "apply"}
    assert acts == {
        200: "skip",
        210: "skip",
        220: "rollback",
        300: "skip",
        310: "skip",
        320: "halt",
    }
    rb = ds[220]
    assert [f.code for f in rb.findings] == ["R102", "R204", "R202"]
    assert rb.bad_steps == [200, 210, 220]
    assert [f.code for f in ds[320].findings][-1] == "R203"
    with pytest.raises(RunHalted):
        ds[320].raise_if_halt()
    ds[220].raise_if_halt()  # a rollback is not a halt


def test_divergence_rolls_back_with_the_divergent_steps_as_bad():
    loss = S.plant_divergence(S.clean_loss(800, seed=2, noise=0.01), 400)
    ds = feed(Guard(), loss)
    rollbacks = [d for d in ds if d.action == "rollback"]
    assert len(rollbacks) == 1
    d = rollbacks[0]
    assert [f.code for f in d.findings] == ["R104", "R202"]
    since = d.findings[0].data["since_step"]
    assert d.bad_steps == list(range(since, d.step + 1))


def test_actions_are_configurable():
    loss = S.clean_loss(300, seed=3)
    loss[150] *= 3.0
    ds = feed(Guard(actions={"R102": "apply"}), loss)
    assert [f.code for f in ds[150].findings] == ["R102"] and ds[150].action == "apply"
    loss[250] = math.nan
    ds = feed(Guard(config=GuardsConfig(actions={"R101": "halt"})), loss)
    assert ds[250].action == "halt"
    assert [f.code for f in ds[250].findings] == ["R101", "R203"]
    with pytest.raises(ConfigError):
        Guard(actions={"R101": "explode"})


def test_disabled_guard_applies_everything():
    loss = S.clean_loss(100)
    loss[50] = math.nan
    ds = feed(Guard(config=GuardsConfig(enabled=False)), loss)
    assert all(d.action == "apply" and not d.findings for d in ds)


def test_state_round_trip_and_after_rollback_keeps_counters(tmp_path):
    loss = S.clean_loss(600, seed=4, noise=0.02)
    for at in (300, 305, 310, 500):
        loss[at] *= 3.0
    whole = Guard()
    ref = feed(whole, loss)
    first = Guard()
    feed(first, loss[:400])
    state = json.loads(json.dumps(first.state_dict()))
    second = Guard()
    second.load_state_dict(state)
    rest = feed(second, loss[400:], start=400)
    assert [(d.step, d.action) for d in rest] == [(d.step, d.action) for d in ref[400:]]
    assert second.rollbacks == whole.rollbacks == 1

    # After a rollback the monitors take the checkpoint's windows, the counters stay.
    ckpt = Guard()
    feed(ckpt, loss[:250])
    ckpt_state = ckpt.state_dict()
    second.after_rollback(ckpt_state)
    assert second.rollbacks == 1
    assert second.monitors.state_dict() == ckpt_state["monitors"]


def test_run_dir_gets_finding_rows(tmp_path):
    loss = S.clean_loss(100)
    loss[60] = math.inf
    feed(Guard(run_dir=tmp_path), loss)
    rows = [json.loads(line) for line in (tmp_path / "guard.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["code"], r["step"]) for r in rows] == [
        ("finding", "R101", 60),
        ("finding", "R201", 60),
    ]


def _one_step(model, xb, yb):
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    return [loss.detach()] + [p.grad.detach().clone() for p in model.parameters()]


def test_rerun_identical_points_to_data_or_software():
    model, _, x, y = make_problem(5)
    first = _one_step(model, x[:64], y[:64])
    second = _one_step(model, x[:64], y[:64])
    f = Guard().classify_rerun(first, second, step=7)
    assert (f.code, f.step, f.data["cause"]) == ("R206", 7, "deterministic")


def test_rerun_after_a_bit_flip_points_to_hardware():
    model, _, x, y = make_problem(6)
    first = _one_step(model, x[:64], y[:64])
    with torch.no_grad():  # silent corruption: one bit of one weight flips between the runs
        bits = model.weight.data.view(torch.int32)
        bits[0, 3] ^= 1 << 20
    second = _one_step(model, x[:64], y[:64])
    f = classify_rerun(first, second)
    assert f.code == "R205" and f.data["cause"] == "hardware"
    assert f.data["max_abs_diff"] > 0


def test_rerun_nan_in_both_is_deterministic():
    a = torch.tensor([1.0, math.nan])
    assert classify_rerun(a, a.clone()).code == "R206"
    assert classify_rerun({"loss": 1.0}, {"loss": 1.0 + 1e-7}, rtol=1e-6).code == "R206"
    assert classify_rerun(np.float64(1.0), 1.0 + 1e-7).code == "R205"


def test_guards_config_schema():
    fields = GuardsConfig.model_fields
    missing = [name for name, f in fields.items() if not f.description]
    assert missing == []
    for key in ("enabled", "actions", "max_rollbacks", "spike_window", "hang_floor_s"):
        assert key in fields
    with pytest.raises(ValidationError):
        GuardsConfig(unknown_key=1)
    with pytest.raises(ValidationError):
        GuardsConfig(actions={"R101": "reboot"})
    with pytest.raises(ValidationError):
        GuardsConfig(actions={"loss": "skip"})
    assert GuardsConfig(actions={"R102": "apply"}).actions == {"R102": "apply"}


def test_default_actions_documented_codes_exist():
    from trainguard.codes import get_code

    for code in guard_mod.DEFAULT_ACTIONS:
        assert get_code(code).code == code


def test_example_guard_loop(tmp_path):
    import runpy
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "guard_loop.py"
    main = runpy.run_path(str(example))["main"]
    summary = main(str(tmp_path), steps=240)
    assert summary["actions"] == {"skip": [100, 150, 220, 221, 223, 224], "rollback": [222],
                                  "halt": []}  # fmt: skip
    assert summary["skipped_batches"] == [220, 221, 222]
    # Each refused step rerun on its batch: the same result, the data's fault (R206).
    assert summary["reruns"] == [(s, "R206") for s in (100, 150, 220, 221, 222, 223, 224)]
    assert summary["finite"] is True
    assert summary["final_loss"] < 1.0
    assert (tmp_path / "guard.jsonl").exists()
