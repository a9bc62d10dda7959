"""Shuffle quality: does the data order mix sources as a random order would? (D301, D302)

For windows of `window` consecutive samples we compare the window's count of each source with
what the global mix predicts, by Pearson's chi-square. Under a random order each window's
statistic follows (approximately) a chi-square with k-1 degrees of freedom, so the summed
statistic over W windows follows one with W(k-1). We report the ratio of the observed mean to
that expectation (1 for a random order; a permutation, which samples without replacement, gives
slightly less) and the p-value of the sum. An order is poor when both say so: p < 1e-6 and a
ratio of at least 2. The effect-size bound keeps huge, harmlessly imperfect orders from failing.

Many sources with few samples each (every file of a corpus) would leave expected counts far
below the ~5 the chi-square approximation needs, so sources are pooled into bins in sorted
label order until each bin expects at least `min_expected` samples per window. Sorting puts
neighbouring files (the ones a sequential or buffered loader reads together) in the same bin,
which is exactly the locality a poor shuffle shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as sps

from trainguard.findings import Finding

P_POOR = 1e-6
RATIO_POOR = 2.0


def _bins(labels: np.ndarray, window: int, min_expected: float) -> tuple[np.ndarray, int]:
    """Each sample's bin: sources pooled in sorted order to >= min_expected per window."""
    uniq, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    target = min_expected * len(labels) / window  # samples per bin over the whole order
    bin_of_source = np.empty(len(uniq), dtype=np.int64)
    current, filled = 0, 0
    for s, c in enumerate(counts):
        bin_of_source[s] = current
        filled += c
        if filled >= target:
            current, filled = current + 1, 0
    if filled and current > 0:
        bin_of_source[bin_of_source == current] = current - 1  # fold a small tail bin back
    return bin_of_source[inverse], int(bin_of_source.max() + 1)


def shuffle_quality(
    labels: Sequence[str] | np.ndarray,
    window: int | None = None,
    min_expected: float = 5.0,
) -> tuple[list[Finding], dict[str, Any]]:
    """Findings (D301 poor mix, D302 not measurable) and statistics for an order's labels.

    `labels[i]` is the source of the i-th sample in training order. `window` defaults to
    min(256, n // 20), so there are at least 20 windows.
    """
    arr = np.asarray(labels).astype(str)
    n = len(arr)
    window = window or max(2, min(256, n // 20))
    n_windows = n // window
    n_sources = len(np.unique(arr)) if n else 0
    stats: dict[str, Any] = {"samples": n, "sources": n_sources, "window": window}
    if n_sources < 2 or n_windows < 2:
        why = "fewer than two sources" if n_sources < 2 else "too few samples for two windows"
        return [Finding.of("D302", f"shuffle quality not measured: {why}", data=stats)], stats
    bins, k = _bins(arr, window, min_expected)
    if k < 2:
        # Too few samples per window to split sources: use the two halves of the label order.
        k, bins = 2, (np.searchsorted(np.unique(arr), arr) >= n_sources // 2).astype(np.int64)
    used = bins[: n_windows * window].reshape(n_windows, window)
    observed = np.stack([np.bincount(row, minlength=k) for row in used])  # (W, k)
    expected = window * np.bincount(bins, minlength=k) / n  # (k,)
    chi2 = ((observed - expected) ** 2 / expected).sum(axis=1)  # (W,)
    df = k - 1
    ratio = float(chi2.mean() / df)
    p_value = float(sps.chi2.sf(chi2.sum(), n_windows * df))
    worst = int(np.argmax(chi2))
    stats |= {
        "bins": k,
        "windows": n_windows,
        "mean_chi2_ratio": round(ratio, 4),
        "p_value": p_value,
        "worst_window": worst,
        "worst_window_chi2_ratio": round(float(chi2[worst] / df), 4),
        "share_windows_p_lt_0_001": round(float(np.mean(sps.chi2.sf(chi2, df) < 1e-3)), 4),
    }
    if p_value < P_POOR and ratio >= RATIO_POOR:
        msg = (
            f"windows of {window} samples mix {n_sources} sources {ratio:.1f}x worse than a "
            f"random order (chi-square p={p_value:.1e}); worst window starts at sample "
            f"{worst * window}"
        )
        return [Finding.of("D301", msg, data=stats)], stats
    return [], stats


def order_shuffle_quality(
    dataset: Any,
    order: Any,
    seq_len: int,
    count: int | None = None,
    start: int = 0,
    window: int | None = None,
) -> tuple[list[Finding], dict[str, Any]]:
    """Shuffle quality of `count` samples of an order (`order.sample_ids(start, count)`, e.g.
    `ElasticOrder`) over a dataset with `sample_sources(ids, seq_len)` (a `TokenDataset`)."""
    count = count or min(int(dataset.num_samples(seq_len)), 20_000)
    ids = np.asarray(order.sample_ids(start, count))
    return shuffle_quality(dataset.sample_sources(ids, seq_len), window=window)


def sequential_order(num_samples: int) -> np.ndarray:
    """What a naive loader does: files read in sequence, no shuffle."""
    return np.arange(num_samples, dtype=np.int64)


def buffer_shuffle_order(num_samples: int, buffer: int, seed: int = 0) -> np.ndarray:
    """A streaming shuffle buffer (as in tf.data / webdataset) over the sequential stream:
    emit a random element of a `buffer`-sized reservoir, refill from the stream."""
    rng = np.random.default_rng(seed)
    out = np.empty(num_samples, dtype=np.int64)
    buf = list(range(min(buffer, num_samples)))
    nxt = len(buf)
    for i in range(num_samples):
        j = int(rng.integers(len(buf)))
        out[i] = buf[j]
        if nxt < num_samples:
            buf[j] = nxt
            nxt += 1
        else:
            buf[j] = buf[-1]
            buf.pop()
    return out
