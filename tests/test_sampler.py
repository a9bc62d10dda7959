"""`ElasticSampler`: a pure function of (seed, step, skips), the very positions and batch hashes
`trainguard run` reads (across epochs, after rollbacks), rank slices and micro-batches, set_step,
length, state, N -> M process resumes, and its bad input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from loophelpers import loop_without_data
from trainguard import ElasticSampler
from trainguard.data.order import ElasticOrder, batch_hash
from trainguard.errors import BadInputError
from trainguard.guard.decision import Decision
from trainguard.train import actions


def sampler(n: int = 10, g: int = 4, **kw) -> ElasticSampler:
    return ElasticSampler(n, global_batch_size=g, seed=kw.pop("seed", 7), **kw)


# -- a pure function ---------------------------------------------------------------------------
def test_batch_ids_are_a_pure_function_of_seed_and_step() -> None:
    a, b = sampler(101, 8), sampler(101, 8)
    steps = list(range(40))  # 40 * 8 > 101: three epochs
    random.Random(0).shuffle(steps)
    shuffled = {s: b.batch_ids(s).tolist() for s in steps}  # any query order, same answers
    for s in range(40):
        assert a.batch_ids(s).tolist() == shuffled[s]
        assert a.batch_hash(s) == batch_hash(a.batch_ids(s))
    order = ElasticOrder(101, 7)
    assert a.batch_ids(13).tolist() == order.sample_ids(13 * 8, 8).tolist()
    assert sampler(101, 8, seed=8).batch_ids(0).tolist() != a.batch_ids(0).tolist()


def test_a_batch_straddles_the_epoch_boundary() -> None:
    s = sampler(10, 4)  # step 2 reads positions 8..11: two of epoch 0, two of epoch 1
    order = ElasticOrder(10, 7)
    ids = s.batch_ids(2).tolist()
    assert ids == [order.index(0, 8), order.index(0, 9), order.index(1, 0), order.index(1, 1)]
    epoch0 = np.concatenate([s.batch_ids(0), s.batch_ids(1), s.batch_ids(2)[:2]])
    assert sorted(epoch0.tolist()) == list(range(10))  # each sample once per epoch


# -- the same order as `trainguard run` ----------------------------------------------------------
def test_positions_and_hashes_equal_runs_reader_with_rollbacks(tmp_path: Path) -> None:
    """`trainguard run`'s rollback (train/actions.py: real checkpoints in the run's layout, the
    guard's restore) on 10 samples in batches of 4, so that batches straddle epochs: every step
    reads what the run read before the sampler (`OldReader`, its reader kept here as the
    reference: the position advances one global batch per step, jumps over skipped ranges, and
    a rollback restores the checkpoint's position and skips the bad steps' batches)."""
    n, g = 10, 4
    order = ElasticOrder(n, 7)
    loop = loop_without_data(tmp_path, num_samples=n, global_batch=g)
    ctx, s = loop.ctx, loop.sampler

    class OldReader:
        def __init__(self) -> None:
            self.position, self.skipped, self.saved = 0, {}, {}
            self.read: dict[int, int] = {}

        def next(self, step: int) -> int:
            while self.position in self.skipped:
                self.position = self.skipped[self.position]
            self.read[step] = self.position
            return self.position

        def rollback(self, to: int, bad: list[int]) -> None:
            for b in bad:
                if b >= to:  # steps count from 0: checkpoint `to` is before step `to`
                    self.skipped[self.read[b]] = self.read[b] + g
            self.position = self.saved[to]

    old = OldReader()
    run_hashes: dict[int, str] = {}  # the last batch each step read (steps count from 0)

    def steps_until(done: int) -> None:
        while ctx.step < done:
            step = ctx.step
            pos = s.position(step)
            assert pos == old.next(step), step
            run_hashes[step] = batch_hash(order.sample_ids(pos, g))
            ctx.progress.advance(0)
            old.position += g
            if (step + 1) % 3 == 0:  # checkpoint step + 1: the steps done
                loop.checkpointer.save(step + 1, loop.state)
                old.saved[step + 1] = old.position

    def roll_back(at: int, bad: list[int]) -> None:
        actions.roll_back(loop, Decision(at, "rollback", bad_steps=bad))
        old.rollback(ctx.step, bad)

    steps_until(5)
    roll_back(4, [3, 4])  # back to checkpoint 3; steps 3 and 4 read new batches
    steps_until(8)
    roll_back(7, [2, 6, 7])  # back to 6; step 2 is before the checkpoint: not skipped
    steps_until(9)
    roll_back(8, [6, 8])  # back to 9, the newest checkpoint: nothing left to skip
    steps_until(14)
    assert s.skipped_positions == sorted([a, b] for a, b in old.skipped.items())
    assert len(s.skipped_positions) == 4
    for step, h in run_hashes.items():
        assert s.batch_hash(step) == h, step
    events = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").open())]
    assert [(e["from_step"], e["to_step"]) for e in events if e.get("event") == "rollback"] == [
        (4, 3),
        (7, 6),
        (8, 9),
    ]
    fresh = sampler(n, g)
    fresh.load_state_dict(json.loads(json.dumps(s.state_dict())))  # a checkpoint round trip
    assert [fresh.batch_hash(k) for k in range(14)] == [run_hashes[k] for k in range(14)]


def test_batch_hashes_equal_a_finished_run(finished_tiny_run: Path) -> None:
    from trainguard.config.load import load_recipe
    from trainguard.data.prepare import prepare_data

    recipe = load_recipe(str(finished_tiny_run / "recipe.yaml"))
    data = prepare_data(recipe.data, recipe.tokenizer, progress=False)
    s = ElasticSampler(
        data.train.num_samples(recipe.data.seq_len),
        global_batch_size=recipe.train.batch_size * recipe.train.grad_accum,
        seed=recipe.train.seed,
    )
    rows = [json.loads(line) for line in (finished_tiny_run / "metrics.jsonl").open()]
    logged = {r["step"]: r["batch_hash"] for r in rows if r.get("kind") == "step"}
    assert sorted(logged) == list(range(12))  # the run's steps count from 0, as the sampler's
    assert {step: s.batch_hash(step) for step in logged} == logged


# -- ranks, micro-batches, iteration -----------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3, 6])
def test_rank_slices_assemble_the_global_batch(world: int) -> None:
    ranks = [sampler(50, 6, rank=r, world_size=world) for r in range(world)]
    for step in range(12):
        parts = [r.rank_ids(step) for r in ranks]
        assert np.concatenate(parts).tolist() == ranks[0].batch_ids(step).tolist()
        assert all(len(p) == 6 // world for p in parts)


def test_micro_batches_through_a_dataloader() -> None:
    s = sampler(40, 12, rank=1, world_size=2, max_steps=5, micro_batch_size=2)
    assert (s.local_batch_size, s.micro_batch_size, s.accum_steps) == (6, 2, 3)
    data = TensorDataset(torch.arange(40))
    loader = DataLoader(data, sampler=s, batch_size=s.micro_batch_size)
    got = [b[0].tolist() for b in loader]
    want = [m.tolist() for step in range(5) for m in s.micro_batch_ids(step)]
    assert got == want and len(got) == 5 * 3
    assert np.concatenate(s.micro_batch_ids(3)).tolist() == s.rank_ids(3).tolist()
    assert len(loader) == 15  # the DataLoader's length comes from the sampler's


def test_set_step_iteration_end_and_length() -> None:
    s = sampler(30, 4, rank=0, world_size=2, max_steps=6)
    assert len(s) == 12 and len(list(s)) == 12  # 6 steps x 2 samples, then it ends
    it = iter(s)
    first = [next(it) for _ in range(3)]  # an iterator (or a prefetching loader) ran ahead
    s.set_step(4)
    assert len(s) == 4
    assert list(s) == s.rank_ids(4).tolist() + s.rank_ids(5).tolist()
    assert first + list(it) == list(sampler(30, 4, rank=0, world_size=2, max_steps=6))
    s.set_step(9)
    assert len(s) == 0 and list(s) == []
    endless = sampler(30, 4)
    with pytest.raises(TypeError, match="max_steps"):
        len(endless)
    assert next(iter(endless)) == endless.batch_ids(0)[0]


def test_defaults_to_one_process_without_torch_distributed() -> None:
    s = sampler(30, 4)
    assert (s.rank, s.world_size, s.local_batch_size) == (0, 1, 4)


# -- skips and state ---------------------------------------------------------------------------
def test_skip_moves_later_steps_on_by_position() -> None:
    s, ref = sampler(30, 4), sampler(30, 4)
    before = [s.batch_hash(k) for k in range(10)]
    assert s.skip([3, 4]) == [[12, 16], [16, 20]]
    assert [s.batch_hash(k) for k in range(3)] == before[:3]  # the past is untouched
    assert s.batch_hash(3) == before[5] and s.batch_hash(4) == before[6]
    s.skip([3])  # the step that now reads block 5
    assert s.batch_hash(3) == ref.batch_hash(6)
    assert s.skipped_positions == [[12, 16], [16, 20], [20, 24]]
    s.skip([3, 3])
    assert len(s.skipped_positions) == 4  # a step's block is recorded once


def test_state_round_trip_and_resume_on_another_world_size() -> None:
    """Saved by 2 ranks after a rollback, resumed by 3: the same global batches as 1 rank."""
    g = 6
    reference = sampler(40, g)
    reference.skip([5, 6])
    saved = sampler(40, g, rank=1, world_size=2)
    saved.skip([5, 6])
    state = json.loads(json.dumps(saved.state_dict()))  # checkpoints hold it as JSON
    resumed = [sampler(40, g, seed=99, rank=r, world_size=3) for r in range(3)]
    for r in resumed:
        r.load_state_dict(state)  # the saved seed wins: the run continues its own order
    for step in range(8, 20):
        got = np.concatenate([r.rank_ids(step) for r in resumed])
        assert got.tolist() == reference.batch_ids(step).tolist()
        assert batch_hash(got) == reference.batch_hash(step)


# -- bad input ---------------------------------------------------------------------------------
def test_bad_input_is_refused_with_the_values_named() -> None:
    with pytest.raises(BadInputError, match="3 samples, fewer than one global batch of 4"):
        sampler(3, 4)
    with pytest.raises(BadInputError, match="global_batch_size=10 does not split evenly over 3"):
        sampler(30, 10, rank=0, world_size=3)
    with pytest.raises(BadInputError, match="rank 2 is outside world size 2"):
        sampler(30, 4, rank=2, world_size=2)
    with pytest.raises(BadInputError, match="micro_batch_size=3 does not divide"):
        sampler(30, 8, rank=0, world_size=2, micro_batch_size=3)
    with pytest.raises(BadInputError, match="global_batch_size must be at least 1"):
        sampler(30, 0)


def test_a_state_from_another_dataset_or_batch_size_is_refused() -> None:
    state = sampler(30, 4).state_dict()
    with pytest.raises(BadInputError, match="dataset of 30 samples, this sampler's has 31"):
        sampler(31, 4).load_state_dict(state)
    with pytest.raises(BadInputError, match="global_batch_size=4, this sampler has global_b"):
        sampler(30, 6).load_state_dict(state)
    with pytest.raises(BadInputError, match="not an ElasticSampler state"):
        sampler(30, 4).load_state_dict({"seed": 1})
    with pytest.raises(BadInputError, match="not whole global batches of 4"):
        sampler(30, 4).load_state_dict(state | {"skipped_positions": [[2, 6]]})
