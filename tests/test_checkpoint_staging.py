"""The copy an asynchronous save of `trainguard run` writes from (checkpoint/staging.py): the
files are byte for byte a save in the loop's, the copies are kept and refilled from one save to
the next, they are made on one thread, and no thread is started inside the first save."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from loophelpers import run_state
from trainguard import ElasticSampler
from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.checkpoint.staging import Staging
from trainguard.config.load import validate_recipe
from trainguard.model.gpt import GPT
from trainguard.train.layout import Progress, RunLayout
from trainguard.train.optim import build_optimizer

FILES = (
    "model.safetensors",
    "optimizer.pt",
    "rng.pt",
    "trainer.json",
    "loader.json",
    "recipe.yaml",
    "env.json",
)


def training(optimizer: str) -> tuple[torch.nn.Module, Any]:
    """A tiny GPT (its output head tied to the token embedding) and the recipe's optimizer."""
    recipe = validate_recipe(
        {
            "model": {"n_layers": 1, "d_model": 16, "n_heads": 2},
            "data": {"seq_len": 8},
            "train": {"optimizer": optimizer},
        }
    )
    torch.manual_seed(0)
    model = GPT(recipe.model, vocab_size=32, seq_len=8)
    return model, build_optimizer(recipe, model)


def train_step(model: torch.nn.Module, optimizer: Any) -> None:
    optimizer.zero_grad()
    model(torch.randint(0, 32, (2, 8))).float().pow(2).mean().backward()
    optimizer.step()


def layout_recipe() -> dict[str, Any]:
    return {"name": "test", "train": {"lr": 0.001}}


class GatedLayout(RunLayout):
    """Writes only once `gate` is set: the test changes the live state first."""

    def __init__(self) -> None:
        super().__init__(layout_recipe(), {"torch": "x"})
        self.gate = threading.Event()

    def write(self, folder: Path, snapshot: Any) -> None:
        assert self.gate.wait(timeout=120)
        super().write(folder, snapshot)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_async_saves_write_the_bytes_a_save_in_the_loop_writes(
    tmp_path: Path, torch_globals: None, optimizer: str
) -> None:
    model, opt = training(optimizer)
    progress = Progress()
    state = run_state(
        model, opt, ElasticSampler(100, global_batch_size=2, seed=0), progress=progress
    )
    layout = GatedLayout()
    background = Checkpointer(tmp_path / "async", keep=10, async_save=True, layout=layout)
    in_loop = Checkpointer(
        tmp_path / "sync", keep=10, layout=RunLayout(layout_recipe(), layout.env)
    )
    try:
        for step in (1, 2, 3):
            train_step(model, opt)
            progress.step = step
            in_loop.save(step, state)
            layout.gate.clear()
            handle = background.save(step, state)
            train_step(model, opt)  # the live state moves on before the copy is written
            layout.gate.set()
            handle.wait()
    finally:
        background.close()
    for step in (1, 2, 3):  # 1 allocates the copies; 2 and 3 refill them
        for name in FILES:
            a = (tmp_path / "async" / f"step-{step}" / name).read_bytes()
            b = (tmp_path / "sync" / f"step-{step}" / name).read_bytes()
            assert a == b, f"step {step}: {name} differs"
    assert layout.staging.refills == 4  # the model's and the optimizer's, at steps 2 and 3


def test_the_copy_is_kept_apart_from_the_live_state_and_refilled(torch_globals: None) -> None:
    model, opt = training("adamw")
    train_step(model, opt)
    staging = Staging()
    first = staging.model(model).state_dict()
    at_first = {k: v.clone() for k, v in model.state_dict().items()}
    train_step(model, opt)
    assert all(torch.equal(first[k], at_first[k]) for k in first)  # the loop's update: not seen
    second = staging.model(model).state_dict()
    assert all(second[k] is first[k] for k in first)  # the same buffers, refilled
    assert all(torch.equal(second[k], v) for k, v in model.state_dict().items())
    # tied weights: one tensor, stored once
    assert second["lm_head.weight"] is second["transformer.wte.weight"]
    assert staging.refills == 1


def test_views_and_shared_storage_are_deep_copied_as_before() -> None:
    base = torch.arange(6.0)
    tree = {"view": base[2:4], "whole": base, "n": 3}  # a view into a larger storage
    staged = Staging().tree(tree)
    assert torch.equal(staged["view"], base[2:4]) and staged["n"] == 3
    base.add_(10)
    assert staged["view"].tolist() == [2.0, 3.0]  # a copy, not the live storage
    # a deepcopy keeps the view a view of the copied whole: saved once, as torch.save would
    assert (
        staged["view"].untyped_storage().data_ptr() == staged["whole"].untyped_storage().data_ptr()
    )


def test_copies_run_on_one_thread_and_the_count_is_restored(
    torch_globals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = training("adamw")
    train_step(model, opt)
    torch.set_num_threads(2)
    threads_seen: list[int] = []
    real_copy = torch._foreach_copy_

    def counting_copy(*args: Any, **kwargs: Any) -> Any:
        threads_seen.append(torch.get_num_threads())
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_copy_", counting_copy)
    staging = Staging()
    for _ in range(2):  # the second round refills, through _foreach_copy_
        staging.model(model)
        staging.tree(opt.state_dict())
    assert threads_seen == [1, 1]
    assert torch.get_num_threads() == 2


def test_the_first_async_save_starts_no_thread(
    tmp_path: Path, torch_globals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = training("adamw")
    train_step(model, opt)
    state = run_state(model, opt, ElasticSampler(100, global_batch_size=2, seed=0))
    checkpointer = Checkpointer(tmp_path, async_save=True, layout=RunLayout(layout_recipe(), {}))
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(thread: threading.Thread) -> None:
        started.append(thread.name)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    try:
        checkpointer.save(1, state).wait()
        checkpointer.save(2, state).wait()
    finally:
        checkpointer.close()
    assert [n for n in started if n.startswith("trainguard-checkpointer")] == []
    assert checkpointer.steps() == [1, 2]
