"""check-model on the reference GPT (issue 2): dense and dropless pass, expert choice and
score-prioritised capacity leak the future, a tiny capacity warns about token drops."""

from __future__ import annotations

import pytest
import torch

from trainguard.checks.model_checks import run_model_checks, run_recipe_checks
from trainguard.config.schema import ModelConfig, MoEConfig, Recipe
from trainguard.model.gpt import GPT

VOCAB, T = 96, 24


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def gpt(moe: MoEConfig | None = None, dropout: float = 0.0, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(ModelConfig(n_layers=2, d_model=32, n_heads=2, dropout=dropout, moe=moe), VOCAB, T)


def codes(report, severity: str) -> set[str]:
    return {f.code for f in report.findings if f.severity == severity}


@pytest.mark.parametrize("seed", [0, 1])
def test_dense_gpt_with_dropout_passes(seed: int) -> None:
    report = run_model_checks(gpt(dropout=0.1, seed=seed), VOCAB, T, seed=seed)
    assert report.ok and codes(report, "warning") == set(), [str(f) for f in report.findings]


def test_dropless_moe_passes_without_drops() -> None:
    report = run_model_checks(gpt(MoEConfig(router="dropless")), VOCAB, T)
    assert report.findings == []
    assert all(v["tokens_dropped"] == 0 for v in report.details["moe_drops"]["eval"].values())


def test_expert_choice_gpt_leaks_the_future() -> None:
    report = run_model_checks(gpt(MoEConfig(router="expert_choice")), VOCAB, T)
    assert "M101" in codes(report, "error")


def test_score_prioritised_capacity_leaks_the_future() -> None:
    model = gpt(MoEConfig(router="token_choice", capacity_factor=0.5))
    for block in model.transformer.h:
        block.mlp.capacity_priority = "score"
    report = run_model_checks(model, VOCAB, T, modes=("eval",))
    assert "M101" in codes(report, "error")


def test_tiny_capacity_warns_about_drops_only() -> None:
    report = run_model_checks(gpt(MoEConfig(router="token_choice", capacity_factor=0.25)), VOCAB, T)
    assert codes(report, "error") == set()
    assert codes(report, "warning") == {"M105"}
    (finding, *_) = [f for f in report.findings if f.code == "M105"]
    assert "capacity" in finding.fix


def test_recipe_checks_use_recipe_shapes_and_precision() -> None:
    recipe = Recipe.model_validate(
        {
            "data": {"seq_len": 16},
            "model": {"n_layers": 1, "d_model": 32, "n_heads": 2},
            "train": {"precision": "bf16", "lr": 1e-3},
        }
    )
    torch.manual_seed(0)
    model = GPT(recipe.model, VOCAB, recipe.data.seq_len)
    report = run_recipe_checks(model, recipe, VOCAB)
    assert report.ok, [str(f) for f in report.findings]
    assert report.details["precision"]["dtype"] == "bf16"
    assert report.details["precision"]["master_weights"] == "fp32"
    assert report.stats["precision_audit"].backwards == 2
