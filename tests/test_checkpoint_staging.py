"""The copy an asynchronous save writes from (FlatLayout, the format of every loop and of
`trainguard run`) (checkpoint/staging.py): the
files are byte for byte a save in the loop's, made in the loop's thread or in the writer thread
(`background_copy`); the copies are kept and refilled from one save to the next; in the loop's
thread they are made on one intra-op thread, and the writer thread never sets the thread count;
a model with buffers is copied inside the save; no thread is started inside the first save."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from loophelpers import run_state
from trainguard import ElasticSampler
from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.checkpoint.layout import FlatLayout, classify
from trainguard.checkpoint.staging import Staging
from trainguard.config.load import validate_recipe
from trainguard.errors import BadInputError
from trainguard.model.gpt import GPT
from trainguard.train.optim import build_optimizer
from trainguard.train.run_state import RunState

FILES = ("state.json", "state.safetensors")


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


class GatedLayout(FlatLayout):
    """Writes only once `gate` is set: the test changes the live state first."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def write(self, folder: Path, snapshot: Any) -> None:
        assert self.gate.wait(timeout=120)
        super().write(folder, snapshot)


@pytest.mark.parametrize("background_copy", [False, True])
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_async_saves_write_the_bytes_a_save_in_the_loop_writes(
    tmp_path: Path, torch_globals: None, optimizer: str, background_copy: bool
) -> None:
    model, opt = training(optimizer)
    progress = RunState()
    state = run_state(
        model, opt, ElasticSampler(100, global_batch_size=2, seed=0), progress=progress
    )
    layout = GatedLayout()
    background = Checkpointer(
        tmp_path / "async",
        keep=10,
        async_save=True,
        layout=layout,
        background_copy=background_copy,
    )
    in_loop = Checkpointer(tmp_path / "sync", keep=10)
    try:
        for step in (1, 2, 3):
            train_step(model, opt)
            progress.step = step
            in_loop.save(step, state)
            layout.gate.clear()
            handle = background.save(step, state)
            background.wait_copied()  # at once without background_copy
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
    assert layout.stagings[0].refills == 4  # the model's and the optimizer's, at steps 2 and 3


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


def test_a_model_with_views_has_its_state_dict_deep_copied_not_the_module() -> None:
    """Weights that are views of one storage fall back to a deep copy: of the state dict,
    since the module's other attributes may be changing beside the writer thread (an MoE
    layer's last auxiliary loss is a tensor of the graph, which deepcopy refuses)."""
    base = torch.arange(6.0)
    live = torch.nn.Module()
    live.whole = torch.nn.Parameter(base)
    live.part = torch.nn.Parameter(base[2:4])  # a view into the same storage
    live.last_aux_loss = live.whole.sum() * 2  # a non-leaf tensor, as a forward leaves it
    staged = Staging().model(live).state_dict()
    with torch.no_grad():
        base.add_(10)
    assert staged["part"].tolist() == [2.0, 3.0]  # a copy, not the live storage
    same_storage = staged["part"].untyped_storage().data_ptr()
    assert same_storage == staged["whole"].untyped_storage().data_ptr()  # still one storage


def test_copies_in_the_loops_thread_run_on_one_thread_and_the_count_is_restored(
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
    layout = FlatLayout()
    parts = classify(run_state(model, opt, ElasticSampler(100, global_batch_size=2, seed=0)))
    for _ in range(2):  # the second round refills, through _foreach_copy_
        layout.snapshot(parts, [], copy=True)
    assert threads_seen == [1, 1]
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("queue", [1, 2])
def test_the_writer_threads_copy_leaves_the_thread_count_alone(
    tmp_path: Path, torch_globals: None, monkeypatch: pytest.MonkeyPatch, queue: int
) -> None:
    """`torch.set_num_threads` sets MKL's thread count for the whole process: from the writer
    thread it would change the count under the loop's matrix products (and their bits). With
    a queue the copy has a thread of its own (trainguard-copier), under the same rule."""
    model, opt = training("adamw")
    train_step(model, opt)
    state = run_state(model, opt, ElasticSampler(100, global_batch_size=2, seed=0))
    checkpointer = Checkpointer(
        tmp_path,
        async_save=True,
        background_copy=True,
        queue=queue,
    )
    copied_in: list[str] = []
    set_in: list[str] = []
    real_copy, real_set = torch._foreach_copy_, torch.set_num_threads

    def recording_copy(*args: Any, **kwargs: Any) -> Any:
        copied_in.append(threading.current_thread().name)
        return real_copy(*args, **kwargs)

    def recording_set(n: int) -> None:
        set_in.append(threading.current_thread().name)
        real_set(n)

    monkeypatch.setattr(torch, "_foreach_copy_", recording_copy)
    monkeypatch.setattr(torch, "set_num_threads", recording_set)
    try:
        for step in range(1, queue + 2):  # the last refills a slot, through _foreach_copy_
            checkpointer.save(step, state)
            checkpointer.wait_copied()
            train_step(model, opt)
        checkpointer.close()
    finally:
        monkeypatch.undo()
    thread = "trainguard-checkpointer" if queue == 1 else "trainguard-copier"
    assert copied_in and all(n.startswith(thread) for n in copied_in)
    assert set_in == []


def test_the_first_async_save_starts_no_thread(
    tmp_path: Path, torch_globals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = training("adamw")
    train_step(model, opt)
    state = run_state(model, opt, ElasticSampler(100, global_batch_size=2, seed=0))
    checkpointer = Checkpointer(tmp_path, async_save=True)
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


def test_a_model_with_buffers_is_copied_inside_the_save(torch_globals: None) -> None:
    """A forward may change a module's buffers (BatchNorm's running statistics), so `stage`
    copies such a model at once instead of beside the next forward."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.AdamW(model.parameters())
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    parts = classify(run_state(model, opt, ElasticSampler(100, global_batch_size=2, seed=0)))
    (_doc, tensors), copy = FlatLayout().stage(parts, [])
    assert copy is None  # nothing left for the writer thread to copy
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.randn(8, 4))  # the next forward: the running statistics move
    staged = tensors["model"]
    assert all(torch.equal(staged[f"state['model'].state_dict().{k}"], before[k]) for k in before)


def test_background_copy_needs_an_async_save(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="async_save=True"):
        Checkpointer(tmp_path, background_copy=True)


def test_a_layout_without_stage_copies_inside_the_save(tmp_path: Path) -> None:
    """`background_copy` moves the copy only for layouts that can (`stage`); the default
    layout's save still returns with the state copied, as without it."""
    w = torch.zeros(100)
    checkpointer = Checkpointer(tmp_path, async_save=True, background_copy=True)
    try:
        handle = checkpointer.save(1, {"w": w})
        w.add_(1.0)  # at once, without wait_copied
        handle.wait()
        loaded = {"w": torch.full((100,), 7.0)}
        assert checkpointer.load_latest(loaded) == 1
    finally:
        checkpointer.close()
    assert torch.equal(loaded["w"], torch.zeros(100))
