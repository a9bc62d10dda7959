"""The recipe's optimizers: which parameters each one owns, schedules, and bitwise resume."""

from __future__ import annotations

import io
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runhelpers import invoke_cli, run_cli
from test_model import T, V, make_model, tokens
from test_run_resume import assert_bitwise_equal, final_weights, step_rows
from trainguard.config.load import load_recipe
from trainguard.train.compute import StepMath
from trainguard.train.optim import AdamW, Muon, OptimizerSet, build_optimizer, orthogonalize


def _recipe(optimizer: str, **train):
    sets = [f"train.optimizer={optimizer}"] + [f"train.{k}={v}" for k, v in train.items()]
    return load_recipe("default", sets)


def _names(model, params) -> set[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)] for p in params}


@pytest.mark.parametrize("router", [None, "token_choice"])
def test_adamw_decays_hidden_matrices_only(router):
    model = make_model(router)
    opt = build_optimizer(_recipe("adamw", lr=1e-3, weight_decay=0.1), model)
    assert isinstance(opt, torch.optim.AdamW)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert decay["peak_lr"] == no_decay["peak_lr"] == 1e-3
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["fused"] is None
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    decayed = _names(model, decay["params"])
    assert not any("ln" in n or "wte" in n or "wpe" in n for n in decayed)
    assert "transformer.h.0.attn.c_attn.weight" in decayed
    assert all(p.dim() == 2 for p in decay["params"])
    kept = _names(model, no_decay["params"])
    assert {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight"} <= kept


@pytest.mark.parametrize("router", [None, "token_choice"])
def test_muon_owns_hidden_matrices_and_adamw_the_rest(router):
    model = make_model(router)
    opt = build_optimizer(_recipe("muon", lr=2e-3, muon_lr=0.03), model)
    assert isinstance(opt, OptimizerSet)
    muon, adamw = opt.optimizers["muon"], opt.optimizers["adamw"]
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    on_muon = [p for g in muon.param_groups for p in g["params"]]
    on_adamw = [p for g in adamw.param_groups for p in g["params"]]
    assert all(p.dim() == 2 for p in on_muon)
    # Every parameter once, none on both (the tied head is the token embedding: AdamW).
    ids = [id(p) for p in on_muon + on_adamw]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert {"transformer.wte.weight", "transformer.wpe.weight"} <= _names(model, on_adamw)
    assert not any("wte" in n or "wpe" in n or "ln" in n for n in _names(model, on_muon))
    assert [g["peak_lr"] for g in opt.param_groups] == [0.03, 2e-3]
    assert adamw.param_groups[0]["weight_decay"] == 0.0


@pytest.mark.parametrize("shape", [(64, 64), (32, 96), (96, 32)])
def test_orthogonalize_pushes_singular_values_to_about_one(shape):
    gen = torch.Generator().manual_seed(3)
    k = min(shape)
    u, _ = torch.linalg.qr(torch.randn(shape[0], k, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(shape[1], k, generator=gen))
    g = u @ torch.diag(torch.logspace(0, 1.7, k)) @ v.T  # condition number 50, as real grads
    s = torch.linalg.svdvals(orthogonalize(g))
    assert s.min() > 0.5 and s.max() < 1.3, s  # the quintic iteration's band, not exactly 1


@pytest.mark.skipif(
    not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon arrived in torch 2.9"
)
def test_muon_matches_torch_muon_update_rule():
    """Same rule as torch.optim.Muon (which iterates in bfloat16, so agreement is approximate)."""
    torch.manual_seed(5)
    w0 = torch.randn(48, 24)
    grads = [torch.randn(48, 24) for _ in range(3)]
    ours, ref = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    opts = [
        Muon([ours], lr=0.05, weight_decay=0.1),
        torch.optim.Muon([ref], lr=0.05, weight_decay=0.1),
    ]
    for g in grads:
        for p, opt in zip((ours, ref), opts, strict=True):
            p.grad = g.clone()
            opt.step()
    moved_ours, moved_ref = ours.detach() - w0, ref.detach() - w0
    assert moved_ours.norm() > 0.1  # it moved by a real amount
    rel = (moved_ours - moved_ref).norm() / moved_ref.norm()
    assert rel < 0.02, rel


def test_muon_refuses_non_matrix_parameters():
    with pytest.raises(ValueError, match="2-D matrices only"):
        Muon([torch.nn.Parameter(torch.zeros(8))])


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("router", [None, "token_choice", "dropless"])
def test_a_few_steps_reduce_the_loss(optimizer, router):
    model = make_model(router, top_k=2)
    opt = build_optimizer(_recipe(optimizer, weight_decay=0.1), model)
    data = tokens(4, T + 1, seed=11)  # one fixed batch: memorising it must work
    x, y = data[:, :-1], data[:, 1:]
    losses = []
    for _ in range(8):
        loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        losses.append(loss.item())
        (loss + model.aux_loss()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert losses[0] == pytest.approx(math.log(V), rel=0.1)  # GPT-2 init: near uniform
    assert losses[-1] < losses[0] - 0.3


def _steps(model, opt, n: int, seed: int) -> None:
    for k in range(n):
        data = tokens(4, T + 1, seed=seed + k)
        F.cross_entropy(model(data[:, :-1]).reshape(-1, V), data[:, 1:].reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_optimizer_state_round_trip_resumes_bitwise(optimizer: str, tmp_path: Path):
    recipe = _recipe(optimizer)
    torch.manual_seed(0)
    a = make_model()
    opt_a = build_optimizer(recipe, a)
    _steps(a, opt_a, 3, seed=100)
    torch.save(opt_a.state_dict(), tmp_path / "opt.pt")
    torch.save(a.state_dict(), tmp_path / "model.pt")

    b = make_model()  # other weights until loaded
    b.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    opt_b = build_optimizer(recipe, b)
    opt_b.load_state_dict(torch.load(tmp_path / "opt.pt", weights_only=True))
    # Moments and momentum buffers are state too: without them the next step would differ.
    _steps(a, opt_a, 2, seed=200)
    _steps(b, opt_b, 2, seed=200)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name


def _same_groups(opt, source, target) -> list[dict]:
    """`opt`'s param groups over `target`'s parameters of the same names as `source`'s."""
    names = {id(p): n for n, p in source.named_parameters()}
    params = dict(target.named_parameters())
    return [dict(g, params=[params[names[id(p)]] for p in g["params"]]) for g in opt.param_groups]


def _assert_same_state(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for k, entry in a["state"].items():
        for name, value in entry.items():
            assert torch.equal(value, b["state"][k][name]), (k, name)


def test_eager_adamw_equals_torch_adamw_bitwise_and_shares_its_state():
    """The run's AdamW is torch's without the dynamo wrappers: the same updates bit for bit,
    the same state dict (a checkpoint loads into either class), step hooks called once."""
    ours, theirs = make_model(), make_model()
    opt_ours = build_optimizer(_recipe("adamw", weight_decay=0.1), ours)
    assert type(opt_ours) is AdamW
    opt_theirs = torch.optim.AdamW(_same_groups(opt_ours, ours, theirs))
    hook_calls: list[int] = []
    opt_ours.register_step_post_hook(lambda *_: hook_calls.append(1))
    _steps(ours, opt_ours, 3, seed=100)
    _steps(theirs, opt_theirs, 3, seed=100)
    assert len(hook_calls) == 3
    for (name, pa), pb in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    _assert_same_state(opt_ours.state_dict(), opt_theirs.state_dict())
    saved = io.BytesIO()  # as a checkpoint holds it: no tensor shared with torch's optimizer
    torch.save(opt_theirs.state_dict(), saved)
    saved.seek(0)
    opt_ours.load_state_dict(torch.load(saved, weights_only=True))
    _steps(ours, opt_ours, 2, seed=200)
    _steps(theirs, opt_theirs, 2, seed=200)
    for (name, pa), pb in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert torch.equal(pa, pb), name


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_run_optimizers_never_import_dynamo(optimizer: str):
    """torch's optimizers import torch._dynamo (longer than `import torch`) on first use; the
    run's do not, through a step, zero_grad and a state dict round trip. A fresh interpreter:
    this one has imported it long ago."""
    code = f"""
import sys
import torch
from test_model import T, V, make_model, tokens
from trainguard.config.load import load_recipe
from trainguard.train.optim import build_optimizer
model = make_model()
opt = build_optimizer(load_recipe("default", ["train.optimizer={optimizer}"]), model)
data = tokens(4, T + 1, seed=1)
logits = model(data[:, :-1]).reshape(-1, V)
torch.nn.functional.cross_entropy(logits, data[:, 1:].reshape(-1)).backward()
opt.step()
opt.zero_grad(set_to_none=True)
opt.load_state_dict(opt.state_dict())
print("torch._dynamo" in sys.modules)
"""
    tests_dir = str(Path(__file__).parent)
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tests_dir
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_optimizer_state_from_another_optimizer_is_refused():
    model = make_model()
    adamw_state = build_optimizer(_recipe("adamw"), model).state_dict()
    muon = build_optimizer(_recipe("muon"), model)
    with pytest.raises(ValueError, match="another optimizer"):
        muon.load_state_dict(adamw_state)


def test_each_group_follows_the_schedule_from_its_own_peak():
    recipe = _recipe("muon", lr=1e-3, muon_lr=0.05, warmup_steps=10, max_steps=100)
    model = make_model()
    opt = build_optimizer(recipe, model)
    trainer = StepMath(recipe, model, opt, None, None, None)  # type: ignore[arg-type]  (no data)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    logged = trainer.apply_update(4)  # step 4 of a 10-step warm-up: half of the peak
    muon_group, adamw_group = opt.param_groups
    assert logged == pytest.approx(0.5e-3)
    assert adamw_group["lr"] == pytest.approx(0.5e-3)
    assert muon_group["lr"] == pytest.approx(0.025)
    trainer.apply_update(100)  # past the cosine: lr * min_lr_ratio
    assert adamw_group["lr"] == pytest.approx(1e-3 * recipe.train.min_lr_ratio)
    assert muon_group["lr"] == pytest.approx(0.05 * recipe.train.min_lr_ratio)


@pytest.mark.slow  # ~30 s; the state round trip above and the SIGKILL tests cover the parts
def test_muon_run_killed_and_resumed_is_bitwise_identical(
    tiny_recipe: Path, finished_tiny_run: Path, tmp_path: Path
):
    muon = ["--set", "train.optimizer=muon", "-q"]
    clean, chained = tmp_path / "clean", tmp_path / "chained"
    assert invoke_cli("run", str(tiny_recipe), "--run-dir", str(clean), *muon).returncode == 0
    args = ["run", str(tiny_recipe), "--run-dir", str(chained), *muon]
    res = run_cli(*args, env={"TRAINGUARD_INJECT": "kill@5:optimizer"})
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    assert_bitwise_equal(final_weights(clean, 12), final_weights(chained, 12))
    assert [r["loss"] for r in step_rows(clean)] == [r["loss"] for r in step_rows(chained)]
    # And Muon changed the trajectory: the run did not silently fall back to AdamW (the
    # finished tiny run is the same recipe with AdamW).
    assert step_rows(finished_tiny_run)[0]["loss"] == step_rows(clean)[0]["loss"]
    assert step_rows(finished_tiny_run)[1]["loss"] != step_rows(clean)[1]["loss"]


def test_replica_digest_covers_muon_and_adamw_state():
    from trainguard.guard.distributed.replica import replica_digest

    model = make_model()
    opt = build_optimizer(_recipe("muon"), model)
    _steps(model, opt, 1, seed=300)
    before = replica_digest(model, opt)
    assert before == replica_digest(model, opt)
    for name in ("muon", "adamw"):  # one flipped state value in either optimizer shows
        state = next(iter(opt.optimizers[name].state.values()))
        buf = state["momentum_buffer" if name == "muon" else "exp_avg"]
        old = buf.view(-1)[0].item()
        buf.view(-1)[0] = old + 1.0
        assert replica_digest(model, opt) != before, name
        assert replica_digest(model) == replica_digest(model)  # weights alone: unchanged
        buf.view(-1)[0] = old
    assert replica_digest(model, opt) == before
