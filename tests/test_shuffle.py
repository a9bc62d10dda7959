"""Shuffle quality: naive orders are flagged (D301), random and elastic orders pass."""

from __future__ import annotations

import numpy as np
import pytest

from trainguard.checks.shuffle_quality import (
    buffer_shuffle_order,
    sequential_order,
    shuffle_quality,
)
from trainguard.data.order import ElasticOrder


def file_labels(n_files: int = 400, seed: int = 0) -> np.ndarray:
    """Samples of files of uneven size, in reading order (as a corpus folder is read)."""
    sizes = np.random.default_rng(seed).integers(1, 40, size=n_files)
    return np.repeat([f"lib/mod{i:04d}.py" for i in range(n_files)], sizes)


def dataset_labels() -> np.ndarray:
    """Three datasets of different sizes, concatenated."""
    return np.repeat(["web", "code", "books"], [5000, 3000, 2000])


def codes(labels) -> list[str]:
    return [f.code for f in shuffle_quality(labels)[0]]


@pytest.mark.parametrize("make", [file_labels, dataset_labels])
def test_naive_orders_are_poor(make):
    labels = make()
    n = len(labels)
    assert codes(labels[sequential_order(n)]) == ["D301"]
    assert codes(labels[buffer_shuffle_order(n, buffer=100, seed=1)]) == ["D301"]
    findings, stats = shuffle_quality(labels[buffer_shuffle_order(n, buffer=1000, seed=1)])
    assert [f.code for f in findings] == ["D301"]
    assert stats["mean_chi2_ratio"] > 2 and stats["p_value"] < 1e-6


@pytest.mark.parametrize("make", [file_labels, dataset_labels])
@pytest.mark.parametrize("seed", range(4))
def test_random_permutation_passes(make, seed):
    labels = make()
    order = np.random.default_rng(100 + seed).permutation(len(labels))
    findings, stats = shuffle_quality(labels[order])
    assert findings == []
    assert 0.7 < stats["mean_chi2_ratio"] < 1.3  # a random order sits at its expectation


@pytest.mark.parametrize("make", [file_labels, dataset_labels])
@pytest.mark.parametrize("seed", [0, 1337])
def test_elastic_feistel_order_passes(make, seed):
    labels = make()
    ids = ElasticOrder(len(labels), seed).sample_ids(0, len(labels))
    assert sorted(ids.tolist()) == list(range(len(labels)))  # one full epoch
    assert codes(labels[ids]) == []


def test_unmeasurable_orders_are_reported_not_passed():
    findings, _ = shuffle_quality(["a"] * 1000)
    assert [(f.code, f.severity) for f in findings] == [("D302", "info")]
    assert codes(["a", "b", "a"]) == ["D302"]


def test_buffer_order_is_a_permutation():
    order = buffer_shuffle_order(1000, buffer=50, seed=3)
    assert sorted(order.tolist()) == list(range(1000))
