"""check-model on the zoo: causal models raise no error, each leaky one raises its codes."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import model_zoo
from runhelpers import invoke_cli
from trainguard.checks._model_runner import ModelCheckInputError, cut_points
from trainguard.checks.model_checks import run_model_checks
from trainguard.checks.model_target import ModelTargetError, load_model
from trainguard.findings import Finding
from trainguard.numerics.logits import ModelOutputError, extract_logits

VOCAB = 50


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models: one thread avoids oversubscribing the 2 shared cores.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def error_codes(findings: list[Finding]) -> set[str]:
    return {f.code for f in findings if f.severity == "error"}


@pytest.mark.parametrize("seq_len,seed", [(9, 0), (33, 3)])
@pytest.mark.parametrize("name", sorted(model_zoo.CAUSAL))
def test_causal_models_raise_nothing(name: str, seq_len: int, seed: int) -> None:
    model = model_zoo.make(name, VOCAB, seed=seed)
    report = run_model_checks(model, VOCAB, seq_len, batch_size=3, seed=seed)
    assert report.ok, [str(f) for f in report.findings]
    assert {f.code for f in report.findings} <= {"M107"}  # at most "skipped in train mode"
    for name_, stats in report.stats.items():
        assert stats.forwards > 0, name_


@pytest.mark.parametrize("seq_len,seed", [(10, 1), (29, 2)])
@pytest.mark.parametrize("name", sorted(model_zoo.LEAKY))
def test_leaky_models_raise_their_codes(name: str, seq_len: int, seed: int) -> None:
    _, required, forbidden = model_zoo.LEAKY[name]
    model = model_zoo.make(name, VOCAB, seed=seed)
    report = run_model_checks(model, VOCAB, seq_len, batch_size=4, seed=seed)
    codes = error_codes(report.findings)
    assert required <= codes, [str(f) for f in report.findings]
    assert not (forbidden & codes), [str(f) for f in report.findings]


def test_future_leak_reports_cuts_positions_and_size() -> None:
    torch.manual_seed(0)
    model = model_zoo.TinyLM(VOCAB, mixer="offbyone", n_layers=1)
    report = run_model_checks(model, VOCAB, 16, batch_size=4, modes=("eval",))
    (leak,) = [f for f in report.findings if f.code == "M101"]
    # One layer off by one: position c-1 sees c, so every cut leaks into exactly the position
    # before it (two layers would reach c-2 as well).
    assert leak.data["leaky_cuts"] == cut_points(16, 16)
    assert leak.data["changed_positions"]["5"] == "4"
    assert leak.data["earliest_changed_position"] == 0
    assert leak.data["max_change"] > 0
    (grad,) = [f for f in report.findings if f.code == "M102"]
    assert grad.data["later_positions_feeding_prefix"]["5"] == "5"
    fmap = grad.data["feeding_map"]
    assert fmap and all(later == str(int(t) + 1) for t, later in fmap.items())  # t+1 feeds t


def test_batch_stats_leak_only_in_train_mode() -> None:
    model = model_zoo.make("batch_stats_over_time", VOCAB)
    report = run_model_checks(model, VOCAB, 12, batch_size=4)
    modes = {f.data["mode"] for f in report.findings if f.severity == "error"}
    assert modes == {"train"}


def test_expert_choice_flips_are_caught_by_perturbation_not_gradient() -> None:
    model = model_zoo.make("expert_choice_moe", VOCAB)
    report = run_model_checks(model, VOCAB, 24, batch_size=4, modes=("eval",))
    codes = error_codes(report.findings)
    assert "M101" in codes and "M102" not in codes  # hard routing has zero gradient


def test_capacity_moe_warns_about_drops_and_nothing_else() -> None:
    torch.manual_seed(0)
    model = model_zoo.TinyLM(VOCAB, ffn="capacity", capacity_factor=0.3)
    report = run_model_checks(model, VOCAB, 20, batch_size=3)
    assert {f.code for f in report.findings} == {"M105"}
    assert all(f.severity == "warning" for f in report.findings)
    layers = report.details["moe_drops"]["eval"]
    assert all(v["drop_fraction"] > 0.01 for v in layers.values())


def test_model_left_as_it_was() -> None:
    model = model_zoo.make("batch_stats_over_time", VOCAB)
    model.train()
    model.blocks[0].eval()  # a mixed-mode model must come back mixed
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    run_model_checks(model, VOCAB, 12, batch_size=4)
    assert model.training and not model.blocks[0].training and model.blocks[1].training
    after = model.state_dict()
    for k, v in before.items():
        assert torch.equal(v, after[k]), k  # running statistics restored too
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


def test_nondeterministic_model_warns_and_tolerates() -> None:
    class Noisy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model_zoo.make("sdpa", VOCAB)
            self.calls = 0

        def forward(self, idx):
            self.calls += 1  # state outside torch's RNG: differs on every call
            return self.inner(idx) + 1e-6 * (self.calls % 3)

    report = run_model_checks(Noisy(), VOCAB, 12, batch_size=2)
    assert {f.code for f in report.findings} >= {"M106"}
    assert report.ok


def test_no_embedding_skips_gradient_map() -> None:
    class OneHot(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(VOCAB, VOCAB)

        def forward(self, idx):
            return self.proj(nn.functional.one_hot(idx, VOCAB).float())

    report = run_model_checks(OneHot(), VOCAB, 8, batch_size=2)
    assert report.ok
    assert [f.data["check"] for f in report.findings if f.code == "M107"] == ["gradient_leak"] * 2


def test_output_forms() -> None:
    x = torch.zeros(2, 3, 5)
    assert extract_logits(x) is x
    assert extract_logits((x, None)) is x
    assert extract_logits({"logits": x}) is x
    assert extract_logits(model_zoo.CausalLMOutput(logits=x)) is x
    with pytest.raises(ModelOutputError, match="holds no logits tensor"):
        extract_logits("no logits here")


def test_bad_inputs_raise_bad_input_errors() -> None:
    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 4)

        def forward(self, idx):
            return self.emb(idx).mean(1)  # (B, C): not per position

    with pytest.raises(ModelCheckInputError, match="expected"):
        run_model_checks(Pooled(), VOCAB, 8)
    with pytest.raises(ModelCheckInputError, match="batch size"):
        run_model_checks(model_zoo.make("sdpa", VOCAB), VOCAB, 8, batch_size=1)
    with pytest.raises(ModelCheckInputError, match="forward raised"):
        run_model_checks(model_zoo.make("sdpa", VOCAB), VOCAB, 600)  # beyond the 512 positions


def test_cut_points_cover_first_and_last() -> None:
    assert cut_points(2, 16) == [1]
    pts = cut_points(128, 16)
    assert pts[0] == 1 and pts[-1] == 127 and len(pts) == 16


# --- CLI ---------------------------------------------------------------------------------


def test_cli_clean_model_exit_0(tmp_path) -> None:
    zoo = model_zoo.__file__
    res = invoke_cli("check-model", f"{zoo}:factory", "--seq-len", "12", "--threads", "1", "--json")
    assert res.returncode == 0, res.stderr
    payload = json.loads(res.stdout)
    assert payload["ok"] is True and payload["vocab_size"] == 64
    assert payload["checks"]["future_leak"]["forwards"] > 0
    assert payload["checks"]["gradient_leak"]["backwards"] > 0


def test_cli_leaky_model_exit_1() -> None:
    res = invoke_cli(
        "check-model", f"{model_zoo.__file__}:leaky_factory", "--seq-len", "12", "--json"
    )
    assert res.returncode == 1, res.stderr
    payload = json.loads(res.stdout)
    assert payload["ok"] is False
    assert {"M101", "M102", "M104"} <= {f["code"] for f in payload["findings"]}


@pytest.mark.parametrize(
    "target,needle",
    [
        ("nowhere.py:factory", "does not exist"),
        ("{zoo}:no_such_factory", "no callable"),
        ("{zoo}", "names no factory"),
        ("trainguard_no_such_pkg.mod:f", "cannot import"),
        ("{zoo}:make", "raised TypeError"),
        ("json:dumps", "raised TypeError"),
    ],
)
def test_bad_targets_raise_bad_input(target: str, needle: str) -> None:
    with pytest.raises(ModelTargetError, match=needle):
        load_model(target.format(zoo=model_zoo.__file__))


def test_module_target_loads() -> None:
    assert isinstance(load_model("model_zoo:factory"), nn.Module)


def test_cli_bad_target_exit_2() -> None:
    res = invoke_cli("check-model", f"{model_zoo.__file__}:no_such_factory", "--json")
    assert res.returncode == 2
    assert "no callable" in res.stderr and "fix:" in res.stderr


class NanColumn(nn.Module):
    """A zoo model whose logits for token 0 are NaN everywhere (say, a mask gone wrong)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = extract_logits(self.inner(x))
        nan = torch.full_like(logits[..., :1], float("nan"))
        return torch.cat([nan, logits[..., 1:]], dim=-1)


@pytest.mark.parametrize("name", ["no_mask", "mask_off_by_one", "faint_pool"])
def test_nan_logits_are_an_error_and_leaks_are_still_found(name: str) -> None:
    """With a NaN among the logits the tolerance was NaN and every comparison False: a leaky
    model passed. Now the NaN is its own error (M108) and the leaks are found on the finite
    entries."""
    _, required, _ = model_zoo.LEAKY[name]
    model = NanColumn(model_zoo.make(name, VOCAB, seed=1))
    report = run_model_checks(model, VOCAB, 10, batch_size=4, seed=1)
    codes = error_codes(report.findings)
    assert {"M108"} | required <= codes, [str(f) for f in report.findings]
    (nan,) = [f for f in report.findings if f.code == "M108" and f.where == "eval mode"]
    assert nan.data["nan"] == nan.data["non_finite"] == 4 * 10  # one column, every position
    assert nan.data["positions"] == "0-9"


def test_nan_logits_do_not_look_like_leaks_in_a_causal_model() -> None:
    model = NanColumn(model_zoo.make("sdpa", VOCAB, seed=0))
    report = run_model_checks(model, VOCAB, 9, batch_size=3, seed=0)
    assert error_codes(report.findings) == {"M108"}, [str(f) for f in report.findings]
    assert {f.code for f in report.findings} <= {"M108", "M107"}


def test_cli_shadow_steps_run_the_shadow_audit() -> None:
    """`--shadow-steps K` with a low dtype trains K steps against float64 (N107): it used to be
    accepted and never passed on."""
    zoo = model_zoo.__file__
    args = ("check-model", f"{zoo}:factory", "--seq-len", "8", "--threads", "1", "--json")
    res = invoke_cli(*args, "--dtype", "bf16", "--shadow-steps", "6")
    assert res.returncode == 0, res.stderr
    payload = json.loads(res.stdout)
    shadow = payload["precision"]["shadow"]
    assert shadow["steps"] == 6 and len(shadow["distances"]) == 6
    (n107,) = [f for f in payload["findings"] if f["code"] == "N107"]
    assert "6 SGD steps" in n107["message"]
    # The audit's passes count the shadow run's 2 x 6 forwards.
    plain = json.loads(invoke_cli(*args, "--dtype", "bf16").stdout)
    assert "shadow" not in plain["precision"]
    audit = payload["checks"]["precision_audit"]["forwards"]
    assert audit - plain["checks"]["precision_audit"]["forwards"] == 12


@pytest.mark.parametrize("dtype", [(), ("--dtype", "fp32")])
def test_cli_shadow_steps_without_a_low_dtype_is_bad_input(dtype: tuple[str, ...]) -> None:
    res = invoke_cli("check-model", f"{model_zoo.__file__}:factory", "--shadow-steps", "4", *dtype)
    assert res.returncode == 2, res.stderr
    assert "--shadow-steps 4 needs a low-precision --dtype" in res.stderr
    assert "fix:" in res.stderr and "Traceback" not in res.stderr
