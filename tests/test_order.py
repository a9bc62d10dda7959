"""Elastic deterministic order: permutation, purity, epochs, ranks, O(1) memory."""

from __future__ import annotations

import os
import socket
import tracemalloc

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from trainguard.data.order import (
    ElasticOrder,
    LoaderState,
    batch_hash,
    compare_batch_hashes,
    rank_slice,
)
from trainguard.errors import BadInputError


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 16, 17, 100, 1023, 1024, 1025, 4097])
def test_each_epoch_is_a_true_permutation(n: int) -> None:
    order = ElasticOrder(n, seed=3)
    for epoch in (0, 1, 5):
        perm = order.permutation(epoch)
        assert perm.dtype == np.int64
        assert np.array_equal(np.sort(perm), np.arange(n))


def test_vectorised_equals_scalar() -> None:
    for n in (1, 6, 1000, 12_345, 10**9 + 7):
        order = ElasticOrder(n, seed=11)
        for start in (0, max(0, n - 3), 3 * n - 1, 7 * n + n // 2):
            ids = order.sample_ids(start, 8)
            assert ids.tolist() == [order.sample_id(p) for p in range(start, start + 8)]


def test_pure_function_of_seed_epoch_position() -> None:
    a, b = ElasticOrder(1000, 42), ElasticOrder(1000, 42)
    # b evaluated in another order and with other batch sizes: same ids at the same positions
    whole = a.sample_ids(0, 5000)
    pieces = {s: b.sample_ids(s, min(37, 5000 - s)) for s in reversed(range(0, 5000, 37))}
    assert np.array_equal(np.concatenate([pieces[s] for s in sorted(pieces)]), whole)
    # batches straddle epochs: positions 990..1009 are the tail of epoch 0 and head of epoch 1
    straddle = a.sample_ids(990, 20)
    assert np.array_equal(straddle[:10], a.permutation(0)[990:])
    assert np.array_equal(straddle[10:], a.permutation(1)[:10])


def test_differs_by_epoch_and_seed() -> None:
    order = ElasticOrder(1000, 42)
    p0, p1 = order.permutation(0), order.permutation(1)
    other = ElasticOrder(1000, 43).permutation(0)
    assert (p0 != p1).mean() > 0.9 and (p0 != other).mean() > 0.9
    # and it shuffles: not close to the identity
    assert (p0 == np.arange(1000)).mean() < 0.02


def _global_batches(n: int, seed: int, steps: int, batch: int, start_step: int = 0) -> list:
    order = ElasticOrder(n, seed)
    return [order.sample_ids(s * batch, batch) for s in range(start_step, steps)]


def test_world_sizes_read_the_same_global_batches_across_restarts() -> None:
    n, seed, batch, steps = 777, 5, 16, 60  # 60 steps > one epoch (777 / 16 = 48.6)
    reference = _global_batches(n, seed, steps, batch)
    for world in (1, 2, 4):
        # each rank owns an independent ElasticOrder; a restart at step 25 switches 2 -> world
        per_rank = [ElasticOrder(n, seed) for _ in range(world)]
        for step in range(steps):
            w = 2 if step < 25 else world
            ranks = per_rank[:w] if w <= world else [ElasticOrder(n, seed) for _ in range(w)]
            parts = [
                rank_slice(o.sample_ids(step * batch, batch), r, w) for r, o in enumerate(ranks)
            ]
            got = np.concatenate(parts)
            assert np.array_equal(got, reference[step]), (world, step)
            assert batch_hash(got) == batch_hash(reference[step])


def _gloo_worker(rank: int, world: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import torch

    order = ElasticOrder(501, seed=9)
    gathered = []
    for step in range(40):  # crosses an epoch: 40 * 16 > 501
        mine = torch.from_numpy(rank_slice(order.sample_ids(step * 16, 16), rank, world))
        parts = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine)
        gathered.append(batch_hash(np.concatenate([p.numpy() for p in parts])))
    if rank == 0:
        out.put(gathered)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2, 4])
def test_real_gloo_ranks_assemble_the_single_process_batches(world: int) -> None:
    want = [batch_hash(b) for b in _global_batches(501, 9, 40, 16)]
    # fork: the children inherit the imported modules, so the test costs no fresh interpreters
    ctx = mp.get_context("fork")
    out = ctx.SimpleQueue()
    mp.start_processes(_gloo_worker, (world, _free_port(), out), nprocs=world, start_method="fork")
    assert out.get() == want


def test_constant_memory_near_a_billion_samples() -> None:
    tracemalloc.start()
    order = ElasticOrder(10**9, seed=1)
    ids = order.sample_ids(10**9 - 128, 256)  # straddles epochs 0 and 1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 256 * 1024  # the permutation table would be 8 GB
    assert len(set(ids.tolist())) >= 255 and ids.min() >= 0 and ids.max() < 10**9
    assert ids[0] == order.index(0, 10**9 - 128) and ids[-1] == order.index(1, 127)


def test_batch_hash_is_order_sensitive_and_dtype_independent() -> None:
    ids = np.array([3, 1, 2], dtype=np.int64)
    assert batch_hash(ids) == batch_hash(ids.astype(np.int32)) == batch_hash([3, 1, 2])
    assert batch_hash(ids) != batch_hash(ids[::-1])
    assert len(batch_hash(ids)) == 16


def test_rank_slice_needs_an_even_split() -> None:
    ids = np.arange(12)
    assert rank_slice(ids, 2, 4).tolist() == [6, 7, 8]
    with pytest.raises(BadInputError, match="does not split evenly over 5"):
        rank_slice(ids, 0, 5)
    with pytest.raises(BadInputError, match="outside world size"):
        rank_slice(ids, 4, 4)


def test_bad_order_inputs() -> None:
    with pytest.raises(BadInputError, match="num_samples=0"):
        ElasticOrder(0, 1)
    with pytest.raises(IndexError):
        ElasticOrder(10, 1).index(0, 10)


def test_loader_state_round_trip_and_checks() -> None:
    state = LoaderState.at(2500, num_samples=1000)
    assert state == LoaderState(epoch=2, position=500, global_position=2500)
    assert state.advanced(700, num_samples=1000) == LoaderState(3, 200, 3200)
    assert LoaderState.from_dict(state.to_dict(), num_samples=1000) == state
    with pytest.raises(BadInputError, match="does not match"):  # data of another size
        LoaderState.from_dict(state.to_dict(), num_samples=900)
    with pytest.raises(BadInputError, match="does not match"):  # an edited loader.json
        LoaderState.from_dict({"epoch": 1, "position": 500, "global_position": 2500}, 1000)
    with pytest.raises(BadInputError, match="is not"):
        LoaderState.from_dict({"position": 3})


def test_batch_hash_mismatch_on_resume_is_d110() -> None:
    order = ElasticOrder(100, 1)
    before = {s: batch_hash(order.sample_ids(s * 8, 8)) for s in range(10)}
    resumed = {s: batch_hash(order.sample_ids(s * 8, 8)) for s in range(5, 12)}
    assert compare_batch_hashes(before, resumed) == []
    replayed = {s: batch_hash(order.sample_ids((s - 1) * 8, 8)) for s in range(5, 12)}
    findings = compare_batch_hashes(before, replayed)
    assert [f.code for f in findings] == ["D110"] * 5 and findings[0].step == 5
