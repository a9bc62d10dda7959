"""The slow-rank rule on synthetic timing fleets (a pure function, no processes): few ranks use
a ratio to the others' median, many ranks a robust z-score with a minimum ratio."""

from __future__ import annotations

import numpy as np
import pytest

from trainguard.doctor.outliers import FEW_RATIO, MANY, slow_ranks


def names(times: dict[int, float]) -> list[int]:
    return [o.rank for o in slow_ranks(times)]


def test_two_ranks_one_three_times_slower_is_named() -> None:
    found = slow_ranks({0: 1.0, 1: 3.0})
    assert [o.rank for o in found] == [1]
    assert found[0].ratio == pytest.approx(3.0) and found[0].z is None


def test_two_ranks_within_the_ratio_are_quiet_and_the_boundary_is_inclusive() -> None:
    assert names({0: 1.0, 1: 1.4}) == []
    assert names({0: 1.0, 1: FEW_RATIO}) == [1]
    assert names({0: 1.0}) == []  # one rank: nothing to compare with


def test_a_fast_rank_is_never_named() -> None:
    # With two ranks only the slower one can be named: here rank 0, 5x rank 1's time.
    assert names({0: 1.0, 1: 0.2}) == [0]
    assert 1 not in names({0: 1.0, 1: 0.2, 2: 1.05, 3: 0.98})


def test_few_ranks_compare_with_the_median_of_the_others() -> None:
    # Four ranks, one 2x: its reference is the others' median (1.0), which it does not inflate.
    found = slow_ranks({0: 1.0, 1: 1.02, 2: 2.0, 3: 0.98})
    assert [o.rank for o in found] == [2] and found[0].reference == pytest.approx(1.0)
    # Seven ranks, one 1.6x and the rest within 10%: only that one.
    assert names({0: 1.0, 1: 1.1, 2: 0.95, 3: 1.6, 4: 1.05, 5: 0.9, 6: 1.0}) == [3]


def test_many_ranks_robust_z_names_a_modest_straggler() -> None:
    rng = np.random.default_rng(0)
    times = {r: float(t) for r, t in enumerate(1.0 + 0.01 * rng.standard_normal(64))}
    assert names(times) == []  # 1% noise: quiet
    times[17] = 1.3  # 30% slower than identical devices: far outside the fleet's spread
    found = slow_ranks(times)
    assert [o.rank for o in found] == [17] and found[0].z > 3.5


def test_many_ranks_a_tiny_spread_does_not_name_a_two_percent_difference() -> None:
    # Identical devices (MAD ~0.1%): a rank 2% slower has a huge z but is not a fault.
    times = {r: 1.0 + 0.001 * (r % 3) for r in range(16)}
    times[5] = 1.02
    assert names(times) == []


def test_many_ranks_all_equal_then_one_slow() -> None:
    times = {r: 2.0 for r in range(MANY)}
    assert names(times) == []
    times[3] = 2.6  # MAD 0: the z-score is unbounded, the ratio (1.3) decides
    assert names(times) == [3]


def test_many_ranks_wide_spread_needs_a_real_outlier() -> None:
    # A heterogeneous-looking fleet with 20% spread: 1.3x is inside it, 3x is not.
    rng = np.random.default_rng(1)
    times = {r: float(t) for r, t in enumerate(1.0 + 0.2 * rng.standard_normal(32).clip(-2, 2))}
    times[0] = 1.3
    assert 0 not in names(times)
    times[0] = 3.0
    assert names(times) == [0]


def test_missing_and_zero_times_are_ignored() -> None:
    assert names({0: 1.0, 1: 0.0, 2: 2.0}) == [2]
