"""Draw docs/dedup_s_curve.png: probability that a pair is merged against its Jaccard similarity.

Three curves for the default setting (14 bands of 8 rows, threshold 0.8): the LSH S-curve
1 - (1 - s^8)^14 (the pair becomes a candidate), the verification probability (the signatures
agree in at least `accept_equal` positions, or they agree in `reject_equal` or more and the exact
Jaccard similarity s is at least the threshold), and their product; dots are the measured rate at
which trainguard's local engine merged planted pairs.

    .venv/bin/python docs/dedup_s_curve.py [--pairs 60]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.stats import binom  # noqa: E402

from trainguard.dedup.local import dedup_texts  # noqa: E402
from trainguard.dedup.lsh import DedupParams, s_curve  # noqa: E402
from trainguard.dedup.planted import Generator, jaccard  # noqa: E402


def measured(params: DedupParams, sims: np.ndarray, pairs: int) -> tuple[list[float], list[float]]:
    g = Generator(seed=123)
    xs, ys = [], []
    for s in sims:
        texts, true = [], []
        for _ in range(pairs):
            a = g.doc()
            b = g.near(a, float(s))
            texts += [a, b]
            true.append(jaccard(a, b))
        batch = [(texts, [None] * len(texts))]
        _, exact_rep, near_root, *_ = dedup_texts(lambda batch=batch: batch, params)
        merged = sum((2 * i + 1) in near_root or (2 * i + 1) in exact_rep for i in range(pairs))
        xs.append(float(np.mean(true)))
        ys.append(merged / pairs)
    return xs, ys


def verified(p: DedupParams, s: np.ndarray) -> np.ndarray:
    """P(a candidate at Jaccard s is merged): sure by its estimate, or by the exact check."""
    sure = binom.sf(p.accept_equal - 1, p.num_perm, s)
    near = binom.cdf(p.accept_equal - 1, p.num_perm, s) - binom.cdf(
        p.reject_equal - 1, p.num_perm, s
    )
    return sure + near * (np.asarray(s) >= p.threshold)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=60, help="planted pairs per similarity")
    ap.add_argument("--out", default=str(Path(__file__).with_name("dedup_s_curve.png")))
    args = ap.parse_args()
    p = DedupParams()
    s = np.linspace(0, 1, 401)
    lsh = s_curve(s, p.bands, p.rows)
    verify = verified(p, s)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(s, lsh, label=f"LSH candidate: 1-(1-s^{p.rows})^{p.bands}")
    ax.plot(s, verify, "--", label="verified: estimate far from the threshold, else exact")
    ax.plot(s, lsh * verify, "k", lw=2, label="merged (product)")
    xs, ys = measured(p, np.array([0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]), args.pairs)
    ax.plot(xs, ys, "o", color="C3", label=f"measured, {args.pairs} planted pairs each")
    ax.axvline(p.threshold, color="grey", lw=0.8)
    ax.set_xlabel("Jaccard similarity of word 5-gram shingles")
    ax.set_ylabel("probability")
    ax.set_title(f"MinHash LSH, {p.bands} bands x {p.rows} rows, threshold {p.threshold}")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out)
    for x, y in zip(xs, ys, strict=True):
        predicted = float(s_curve(x, p.bands, p.rows) * verified(p, np.array(x)))
        print(f"s={x:.3f} merged={y:.3f} predicted={predicted:.3f}")


if __name__ == "__main__":
    main()
