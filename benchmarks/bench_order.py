"""Elastic order (keyed Feistel permutation) vs a precomputed numpy permutation.

Measures, side by side in one run: index lookups per second (vectorised batches and the scalar
path) and peak traced memory, at N = 10^7 and 10^9 samples. The numpy baseline at 10^9 would
hold 8 GB: it is reported as its computed size and not materialised.

    python benchmarks/bench_order.py [--repeats 7] [--write docs/benchmarks/order.md]
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np
from machine import describe

from trainguard.data.order import ElasticOrder


def _median_rate(fn, count: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return count / statistics.median(times)


def _peak(fn) -> int:
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def bench(n: int, batch: int, repeats: int, rng: np.random.Generator) -> dict:
    order = ElasticOrder(n, seed=1)
    idx = rng.integers(0, n, size=batch, dtype=np.int64)
    row: dict = {"n": n, "batch": batch}
    row["feistel_vec"] = _median_rate(lambda: order.permute(0, idx), batch, repeats)
    few = rng.integers(0, n, size=2000).tolist()  # the scalar path is slow: a fixed sample
    row["feistel_scalar"] = _median_rate(
        lambda: [order.index(0, i) for i in few], len(few), repeats
    )
    row["feistel_peak"] = _peak(lambda: ElasticOrder(n, seed=2).sample_ids(n - batch // 2, batch))
    row["numpy_size"] = n * 8
    if n <= 10**8:  # the baseline table fits in memory
        t0 = time.perf_counter()
        perm = np.random.default_rng(0).permutation(n)
        row["numpy_build_s"] = time.perf_counter() - t0
        row["numpy_lookup"] = _median_rate(lambda: perm[idx], batch, repeats)
        row["numpy_peak"] = _peak(lambda: np.random.default_rng(0).permutation(n))
        del perm
    return row


def _mb(x: float) -> str:
    return f"{x / 1e6:,.2f} MB"


def render(rows: list[dict], command: str) -> str:
    lines = [
        "## Elastic data order (`trainguard.data.order`)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {describe()} at the end of the run; numpy {np.__version__}. Medians of "
        "repeated runs; rates are index lookups per second.",
        "",
        "| N | batch | Feistel vectorised | Feistel scalar | numpy perm[idx] | vec / numpy | "
        "Feistel peak mem | numpy table (peak) | numpy build |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        num = r.get("numpy_lookup")
        numpy_rate = f"{num:,.0f}" if num else "n/a (not materialised)"
        ratio = f"{r['feistel_vec'] / num:.3f}" if num else "n/a"
        computed = _mb(r["numpy_size"]) + " computed"
        table = _mb(r["numpy_peak"]) if "numpy_peak" in r else computed
        build = f"{r['numpy_build_s']:.2f} s" if "numpy_build_s" in r else "n/a"
        lines.append(
            f"| {r['n']:.0e} | {r['batch']} | {r['feistel_vec']:,.0f} | {r['feistel_scalar']:,.0f} "
            f"| {numpy_rate} | {ratio} | {_mb(r['feistel_peak'])} | {table} | {build} |"
        )
    small = [r for r in rows if r["batch"] == 256]
    per_batch = ", ".join(f"{256 / r['feistel_vec'] * 1e3:.2f} ms at N={r['n']:.0e}" for r in small)
    lines += [
        "",
        f"Per training step, the ids of a 256-sample global batch cost {per_batch}: "
        "negligible next to a forward and backward pass. N=10^7 is slower per lookup than "
        "10^9: cycle-walking needs more passes the further N sits below the Feistel domain "
        "(10^7 fills 60% of 2^24, 10^9 fills 93% of 2^30; worst case 25%, just above a power "
        "of four).",
        "",
        "The Feistel order needs no table: its memory is a few batch-sized arrays at any N, and "
        "a restart or a change of world size costs nothing to rebuild. A precomputed "
        "permutation is faster per lookup (one gather) but costs 8 bytes per sample in every "
        "process and a build at every epoch, and cannot exist at 10^9 samples on most hosts.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--write", help="write the markdown section to this file")
    args = ap.parse_args()
    print(describe())
    rng = np.random.default_rng(0)
    rows = [bench(n, b, args.repeats, rng) for n in (10**7, 10**9) for b in (256, 65536)]
    for r in rows:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    command = "python benchmarks/bench_order.py" + (f" --repeats {args.repeats}")
    if args.write:
        command += f" --write {args.write}"
    text = render(rows, command)
    print(text)
    if args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
