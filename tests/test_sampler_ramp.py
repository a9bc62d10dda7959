"""Batch-size ramps in `ElasticSampler`: every sample once per epoch across size changes,
resumes across a change on another rank count, a saved schedule's past checked on resume,
constant states of the previous release still loading, and the schedule's strict checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainguard import ElasticSampler
from trainguard.errors import BadInputError, ConfigError

RAMP = [(0, 4), (5, 8), (9, 12)]


def ramp(n: int = 60, schedule=RAMP, **kw) -> ElasticSampler:
    return ElasticSampler(n, global_batch_size=schedule, seed=kw.pop("seed", 7), **kw)


def test_every_sample_once_per_epoch_across_the_size_changes() -> None:
    n, world = 60, 2
    ranks = [ramp(n, rank=r, world_size=world) for r in range(world)]
    stream: list[int] = []
    step = 0
    while len(stream) < 3 * n:  # three epochs, with the changes inside the first
        assert len(ranks[0].rank_ids(step)) == ranks[0].schedule.size(step) // world
        stream += np.concatenate([s.rank_ids(step) for s in ranks]).tolist()
        step += 1
    for epoch in range(3):
        assert sorted(stream[epoch * n : (epoch + 1) * n]) == list(range(n)), epoch
    # The positions are the sum of the sizes before: the 4 x 5 + 8 x 4 = 52 of steps 0-8.
    assert ranks[0].position(9) == 52 and ranks[0].global_batch_size_at(9) == 12


def test_a_resume_across_a_change_on_two_then_one_rank_reads_the_uninterrupted_batches() -> None:
    reference = ramp()  # one process, never interrupted, the same rollback
    reference.skip([4, 5])
    saved = [ramp(rank=r, world_size=2) for r in range(2)]
    for s in saved:  # the rollback at step 4 skips steps 4 and 5, across the change at 5
        s.skip([4, 5])
    state = json.loads(json.dumps(saved[1].state_dict()))  # checkpoints hold it as JSON
    resumed = ramp(seed=99, rank=0, world_size=1)
    resumed.load_state_dict(state)  # the saved seed and skips win
    resumed.set_step(4)
    for step in range(4, 20):  # across both changes
        assert resumed.batch_ids(step).tolist() == reference.batch_ids(step).tolist(), step
        halves = np.concatenate([s.rank_ids(step) for s in saved])
        assert halves.tolist() == reference.batch_ids(step).tolist(), step
    # Through a DataLoader: the micro-batches of a step, more of them as the batch grows.
    data = TensorDataset(torch.arange(60))
    one = ramp(rank=0, world_size=1, max_steps=12, micro_batch_size=2)
    one.load_state_dict(state)
    one.set_step(4)
    assert [one.accum_steps_at(s) for s in (4, 5, 9)] == [2, 4, 6]
    assert len(one) == 4 + 8 * 4 + 12 * 3
    got = torch.cat([b for (b,) in DataLoader(data, sampler=one, batch_size=2)]).tolist()
    want = np.concatenate([reference.batch_ids(s) for s in range(4, 12)]).tolist()
    assert got == want


def test_skipped_samples_are_never_read_again_when_sizes_differ() -> None:
    s = ramp()
    read_before = set(np.concatenate([s.batch_ids(k) for k in (4, 6)]).tolist())
    ranges = s.skip([4, 6])  # not adjacent: step 5 (8 samples) straddles the second range
    assert ranges == [[16, 20], [28, 36]]
    assert s.position(4) == 20 and s.position(6) == 40
    stream = np.concatenate([s.batch_ids(k) for k in range(8)]).tolist()  # within epoch 0
    assert not read_before & set(stream[16:])  # skipped ids come back only in the next epoch
    assert len(set(stream)) == len(stream)
    order = s.order
    want = np.concatenate([order.sample_ids(24, 4), order.sample_ids(36, 4)]).tolist()
    assert s.batch_ids(5).tolist() == want  # the positions before the range, then after


def test_a_schedule_whose_past_disagrees_is_refused_naming_the_step() -> None:
    state = ramp().state_dict()
    other = ramp(schedule=[(0, 4), (3, 8)])
    other.load_state_dict(state)
    other.set_step(3)  # the past (steps 0-2) agrees: the future may change
    with pytest.raises(BadInputError, match=r"disagree at step 3 \(4 vs 8 samples\)"):
        other.set_step(6)
    with pytest.raises(BadInputError, match="disagree at step 9"):
        later = ramp(schedule=[(0, 4), (5, 8), (9, 16)])
        later.load_state_dict(state)
        later.set_step(10)


def test_a_constant_state_of_the_previous_release_loads_into_a_ramp() -> None:
    # What 0.x saved: no schedule, a constant global_batch_size (and its aligned skips).
    old = {"version": 1, "seed": 7, "num_samples": 60, "global_batch_size": 4,
           "skipped_positions": [[8, 12]]}  # fmt: skip
    constant = ElasticSampler(60, global_batch_size=4, seed=0)
    constant.load_state_dict(old)
    assert constant.state_dict() == old  # and a constant still saves the same form
    grown = ramp(schedule=[(0, 4), (10, 8)], seed=0)
    grown.load_state_dict(old)
    grown.set_step(10)  # ten steps of 4: the checkpoint's past
    for step in range(10):
        assert grown.batch_ids(step).tolist() == constant.batch_ids(step).tolist()
    assert grown.position(10) == constant.position(10)
    assert grown.batch_ids(10).tolist() == constant.order.sample_ids(44, 8).tolist()
    early = ramp(schedule=[(0, 4), (6, 8)], seed=0)
    early.load_state_dict(old)
    with pytest.raises(BadInputError, match="disagree at step 6"):
        early.set_step(10)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([], "global_batch_size is empty"),
        ([(1, 4)], r"global_batch_size\[0\] is at step 1"),
        ([(0, 4), (3, 8), (3, 12)], r"global_batch_size\[2\] is at step 3"),
        ([(0, 4), (5, 8.0)], r"global_batch_size\[1\] size must be an integer"),
        ([(0, 4), (5, 0)], r"global_batch_size\[1\] size must be at least 1"),
        ([(0, 4), (True, 8)], r"global_batch_size\[1\] step must be an integer"),
        ([(0, 4), (5,)], r"global_batch_size\[1\] is \(5,\), not a \(step, size\) pair"),
    ],
)
def test_bad_schedules_are_refused_naming_the_argument(schedule, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ramp(schedule=schedule)


def test_every_size_of_the_schedule_is_checked_against_the_ranks_up_front() -> None:
    with pytest.raises(BadInputError, match=r"global_batch_size=6 \(from step 5\) does not split"):
        ramp(schedule=[(0, 4), (5, 6)], rank=0, world_size=4)
    with pytest.raises(BadInputError, match="micro_batch_size=4 does not divide this rank's 2"):
        ramp(schedule=[(0, 8), (5, 4)], rank=0, world_size=2, micro_batch_size=4)
    from trainguard.data.batch_schedule import BatchSchedule  # new with ramps

    assert ramp(schedule=BatchSchedule.of([(0, 4), (5, 4)])).schedule.is_constant
