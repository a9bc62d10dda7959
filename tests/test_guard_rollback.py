"""`Guard.rollback` in a user's own loop: restore through the checkpointer, skip the bad steps'
samples in the sampler, keep the rollback count and the earlier skips across the restore, so
that the run ends bitwise where a run that never read the bad batches ends, and a fault that
keeps coming back halts after `max_rollbacks`. The checkpoints are real `trainguard.Checkpointer`
ones on disk (the rollback reads back what was written, verified).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainguard import Checkpointer, ElasticSampler, Guard, GuardsConfig
from trainguard.errors import RunHalted

N, G, MAX_STEPS, EVERY = 64, 4, 14, 5  # 14 steps x 4 < 64 samples: one epoch


@pytest.fixture(autouse=True)
def rng_guard():
    """A restore puts back the checkpoint's generator states: give this process its own back."""
    t, r, n = torch.get_rng_state(), random.getstate(), np.random.get_state()
    yield
    torch.set_rng_state(t)
    random.setstate(r)
    np.random.set_state(n)


def dataset(poisoned: set[int]) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    x[sorted(poisoned)] = float("nan")  # bad samples: every batch holding one has a NaN loss
    return TensorDataset(torch.arange(N), x, y)


def train(
    tmp_path: Path,
    poisoned: set[int] = frozenset(),
    pre_skipped: list[int] = (),
    nan_from: int | None = None,
    max_rollbacks: int = 3,
) -> dict[str, Any]:
    """The loop of docs/own-loop.md (the README's, shortened). Returns the model, the guard,
    the sampler and the ids each step read."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    sampler = ElasticSampler(N, global_batch_size=G, seed=3, max_steps=MAX_STEPS)
    sampler.skip(pre_skipped)
    config = GuardsConfig(max_rollbacks=max_rollbacks, repeat_count=2, rerun_on=[])
    guard = Guard(run_dir=tmp_path, config=config)
    loader = DataLoader(dataset(set(poisoned)), sampler=sampler, batch_size=G)
    state = {"model": model, "optimizer": optimizer, "sampler": sampler, "guard": guard}
    checkpointer = Checkpointer(tmp_path / "checkpoints")
    read: dict[int, list[int]] = {}

    step = checkpointer.load_latest(state) or 0
    sampler.set_step(step)
    batches = iter(loader)
    for _ in range(200):  # a bound: a guard that lost its rollback count would loop forever
        if step == MAX_STEPS:
            break
        ids, x, y = next(batches)
        read[step] = ids.tolist()
        loss = F.mse_loss(model(x), y)
        if nan_from is not None and step >= nan_from:
            loss = loss * float("nan")  # a fault no data skip cures
        loss.backward()
        decision = guard.step(step, loss=loss, model=model, optimizer=optimizer)
        if decision.action == "rollback":
            step = guard.rollback(checkpointer, state, sampler)
            sampler.set_step(step)
            batches = iter(loader)
            continue
        decision.raise_if_halt()
        if decision.apply:
            optimizer.step()
        optimizer.zero_grad()
        step += 1
        if step % EVERY == 0:
            checkpointer.save(step, state)
    return {"model": model, "guard": guard, "sampler": sampler, "read": read}


def events(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "guard.jsonl").open()]
    return [r for r in rows if r.get("kind") == "event"]


def test_rollback_skips_the_bad_batches_and_ends_like_a_run_without_them(tmp_path: Path) -> None:
    clean = ElasticSampler(N, global_batch_size=G, seed=3)
    poisoned = {int(clean.batch_ids(6)[0]), int(clean.batch_ids(7)[1])}
    out = train(tmp_path / "faulty", poisoned)
    # Steps 6 and 7 read NaN (skipped), R204 asks for a rollback to step 5, skipping both.
    assert out["guard"].rollbacks == 1  # survived the restore of the guard's step-5 state
    assert out["sampler"].skipped_positions == [[24, 28], [28, 32]]
    (event,) = events(tmp_path / "faulty")
    assert (event["from_step"], event["to_step"], event["skipped_steps"]) == (7, 5, [6, 7])
    assert not poisoned & {i for s in range(6, MAX_STEPS) for i in out["read"][s]}
    assert [out["read"][s] for s in range(6, MAX_STEPS)] == [
        clean.batch_ids(s).tolist() for s in range(8, MAX_STEPS + 2)
    ]
    # Bitwise the weights of a run that skipped those batches from the start.
    reference = train(tmp_path / "reference", pre_skipped=[6, 7])
    assert reference["guard"].rollbacks == 0
    for a, b in zip(out["model"].parameters(), reference["model"].parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_fault_that_comes_back_halts_after_max_rollbacks(tmp_path: Path) -> None:
    with pytest.raises(RunHalted, match="R203"):
        train(tmp_path, nan_from=6, max_rollbacks=2)
    rollbacks = events(tmp_path)
    assert [(e["from_step"], e["to_step"]) for e in rollbacks] == [(7, 5), (7, 5)]
    # Each rollback returned to the checkpoint of step 5, whose sampler state has no skips:
    # the first rollback's skips survived the second restore.
    assert [e["skipped_positions"] for e in rollbacks] == [
        [[24, 28], [28, 32]],
        [[32, 36], [36, 40]],
    ]


def test_rollback_without_a_checkpoint_halts(tmp_path: Path) -> None:
    guard = Guard(run_dir=tmp_path)
    sampler = ElasticSampler(N, global_batch_size=G, seed=3)
    with pytest.raises(RunHalted, match="no valid checkpoint"):
        guard.rollback(Checkpointer(tmp_path / "checkpoints"), {"sampler": sampler}, sampler)
