"""A variant's effect against the base, paired by seed: the per-seed differences, a Student t
interval on their mean, and an exact sign-flip (permutation) test.

Pairing by seed removes what base and variant share (the initialisation, the data order), so
the differences vary much less than the runs do. The verdict follows the t interval: an effect
is claimed only when the interval excludes zero; otherwise the answer is "no detectable
difference at this scale", which is not the same as "no difference". The sign-flip test needs
no normality, but with K seeds its smallest two-sided p-value is 2 / 2**K (0.25 with 3 seeds):
it is reported, and the few-seeds caveat said, rather than used to gate the verdict.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

NO_DIFFERENCE = "no detectable difference at this scale"
MIN_SEEDS_FOR_SIGN_TEST = 6
"""Below this many seeds the sign-flip test cannot reach p < 0.05 (2 / 2**5 = 0.0625)."""


def lower_is_better(metric: str) -> bool:
    """Bits per byte and losses fall as a model improves; accuracies rise."""
    last = metric.rsplit("/", 1)[-1]
    return last in ("bpb", "loss", "nll", "ppl") or last.endswith("_loss")


@dataclass(frozen=True)
class Effect:
    """variant minus base on one metric, over the seeds both have."""

    metric: str
    seeds: int
    base_mean: float
    variant_mean: float
    diff: float
    """Mean of the per-seed differences variant - base (in the metric's units)."""
    low: float
    high: float
    level: float
    p_t: float
    """Two-sided p-value of the paired t test (1.0 when it is undefined)."""
    p_sign: float
    """Two-sided p-value of the exact sign-flip test on the differences."""
    verdict: str
    """`better`, `worse`, or NO_DIFFERENCE."""
    lower_is_better: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sign_flip_p(diffs: np.ndarray) -> float:
    """Exact two-sided p of the mean difference under random signs (2**K sign patterns;
    K stays small here: one difference a seed)."""
    k = len(diffs)
    if k == 0:
        return 1.0
    observed = abs(float(diffs.mean()))
    hits = 0
    for signs in itertools.product((1.0, -1.0), repeat=k):
        # A tolerance: a pattern that ties the observed mean counts as at least as extreme.
        if abs(float((diffs * np.array(signs)).mean())) >= observed - 1e-12:
            hits += 1
    return hits / 2**k


def paired_effect(
    metric: str, base: list[float], variant: list[float], level: float = 0.95
) -> Effect:
    """The effect of the variant on `metric`; `base[i]` and `variant[i]` share seed i."""
    if len(base) != len(variant) or not base:
        raise ValueError("paired_effect needs one base and one variant value for each seed")
    b, v = np.asarray(base, dtype=float), np.asarray(variant, dtype=float)
    d = v - b
    k, mean = len(d), float(d.mean())
    if k >= 2:
        se = float(d.std(ddof=1)) / math.sqrt(k)
        if se > 0:
            half = float(sps.t.ppf(0.5 + level / 2, k - 1)) * se
            p_t = float(2 * sps.t.sf(abs(mean) / se, k - 1))
        else:  # every seed moved by exactly the same amount: no spread to doubt it by
            half, p_t = 0.0, 0.0 if mean != 0 else 1.0
    else:  # one seed: no spread to estimate, so no interval
        half, p_t = math.inf, 1.0
    low, high = mean - half, mean + half
    down = lower_is_better(metric)
    if low > 0 or high < 0:
        improved = (mean < 0) if down else (mean > 0)
        verdict = "better" if improved else "worse"
    else:
        verdict = NO_DIFFERENCE
    return Effect(
        metric=metric,
        seeds=k,
        base_mean=float(b.mean()),
        variant_mean=float(v.mean()),
        diff=mean,
        low=low,
        high=high,
        level=level,
        p_t=p_t,
        p_sign=sign_flip_p(d),
        verdict=verdict,
        lower_is_better=down,
    )
