"""A user's own `trainguard.Callback` on `trainguard run`'s loop, through the public
`trainguard.run_recipe(..., callbacks=[...])`: a veto before the optimizer step discards the
update and the row says so; a callback's state survives a resume; the callback order is logged
at the start; the drills' faults are one callback, present only when a plan is active."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import trainguard
from runhelpers import tiny_recipe_dict
from trainguard.config.load import validate_recipe
from trainguard.faults import FaultPlan


@pytest.fixture
def recipe_for(small_corpus: Path, cache_dir: Path, torch_globals: None):
    def make(max_steps: int = 4):
        raw = tiny_recipe_dict(small_corpus, cache_dir)
        raw["train"] |= {"max_steps": max_steps, "eval_interval": 4}
        raw["checkpoint"] |= {"interval": 2}
        return validate_recipe(raw)

    return make


def run(recipe, run_dir: Path, callbacks, faults: str = "") -> trainguard.RunResult:
    return trainguard.run_recipe(
        recipe,
        run_dir,
        progress=False,
        report=False,
        evals=False,
        faults=FaultPlan.parse(faults, rank=0),
        callbacks=callbacks,
    )


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Veto(trainguard.Callback):
    """Vetoes the update of one step; records the weights after every step."""

    name = "veto"

    def __init__(self, step: int) -> None:
        self.step = step
        self.asked: list[tuple[int, str]] = []
        self.weights: dict[int, list[torch.Tensor]] = {}

    def pre_optimizer_step(self, ctx, step: int, decision) -> bool | None:
        self.asked.append((step, decision.action))
        return False if step == self.step else None

    def post_step(self, ctx, step: int, row: dict[str, Any]) -> None:
        self.weights[step] = [p.detach().clone() for p in ctx.model.parameters()]


def test_a_user_callback_vetoes_an_update_and_the_row_says_so(recipe_for, tmp_path) -> None:
    veto = Veto(step=2)
    result = run(recipe_for(), tmp_path / "run", [veto])
    assert result.ok and result.final_step == 4
    # Asked before each applied update with the guard's decision; steps count from 0.
    assert veto.asked == [(0, "apply"), (1, "apply"), (2, "apply"), (3, "apply")]
    same = zip(veto.weights[1], veto.weights[2], strict=True)
    assert all(torch.equal(a, b) for a, b in same)  # step 2's update was discarded
    assert not all(torch.equal(a, b) for a, b in zip(veto.weights[2], veto.weights[3], strict=True))
    steps = {r["step"]: r for r in rows(tmp_path / "run") if r.get("kind") == "step"}
    assert sorted(steps) == [0, 1, 2, 3]  # the rows carry the 0-based index
    assert steps[2]["action"] == "veto" and steps[2]["vetoed_by"] == "veto"
    assert steps[2]["lr"] == 0.0 and steps[3]["action"] == "apply"


class Seen(trainguard.Callback):
    """Keeps the steps it saw; its state travels in the run's checkpoints."""

    name = "seen"

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.loaded: dict[str, Any] | None = None

    def post_step(self, ctx, step: int, row: dict[str, Any]) -> None:
        self.steps.append(step)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": list(self.steps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded, self.steps = state, list(state.get("steps", []))


def test_a_user_callback_keeps_its_state_across_a_resume(recipe_for, tmp_path) -> None:
    run_dir = tmp_path / "run"
    run(recipe_for(4), run_dir, [Seen()])
    again = Seen()
    result = run(recipe_for(6), run_dir, [again])
    assert result.resumed_from == 4 and again.loaded == {"steps": [0, 1, 2, 3]}
    assert again.steps == [0, 1, 2, 3, 4, 5]


def test_the_callback_order_is_logged_at_the_start(recipe_for, tmp_path) -> None:
    class Early(trainguard.Callback):
        name, priority = "early", 1000

    run(recipe_for(), tmp_path / "plain", [Seen(), Early()])
    order = next(r for r in rows(tmp_path / "plain") if r.get("event") == "callbacks")["order"]
    assert order[0] == "early" and "seen" in order and "steplog" in order
    assert "faults" not in order  # no plan: no fault callback on the loop
    run(recipe_for(), tmp_path / "drill", [Seen()], faults="slowdata@9")
    order = next(r for r in rows(tmp_path / "drill") if r.get("event") == "callbacks")["order"]
    assert order[-1] == "faults"  # last: the others hear of a phase before a fault acts in it


def test_callback_is_public_with_every_hook_a_no_op() -> None:
    cb = trainguard.Callback()
    assert cb.pre_optimizer_step(None, 0, None) is None  # type: ignore[arg-type]
    assert cb.on_loss(None, 0, 1.0) is None  # type: ignore[arg-type]
    assert cb.state_dict() == {} and trainguard.Callback.priority == 0


def test_the_step_holds_no_fault_calls_and_no_sampler_of_its_own() -> None:
    """The drills' faults act through the callback's hooks only, and the batch comes from the
    run's ElasticSampler: the arithmetic and the loop neither import the fault plan nor build
    an order or slice ranks themselves."""
    import ast

    import trainguard.train as train_pkg

    root = Path(train_pkg.__file__).parent
    for name in ("compute.py", "spine.py", "actions.py", "device_steps.py", "saving.py"):
        tree = ast.parse((root / name).read_text(encoding="utf-8"))
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        called = {
            n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and hasattr(n.func, "id")
        }
        assert "trainguard.faults" not in imported and "faults" not in attrs, name
        assert not {"ElasticSampler", "ElasticOrder", "rank_slice"} & called, name


def test_a_callback_without_its_own_name_is_refused_before_any_work(recipe_for, tmp_path) -> None:
    from trainguard.errors import BadInputError

    class Nameless(trainguard.Callback):
        pass

    with pytest.raises(BadInputError, match="unique and non-empty") as e:
        run(recipe_for(), tmp_path / "run", [Nameless()])
    assert "`name`" in e.value.fix and not (tmp_path / "run" / "metrics.jsonl").exists()
