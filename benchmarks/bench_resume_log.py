"""A resume's work on the metric log: the cut of the rows it recomputes and goodput's `attempt`
row. Before, the start read the whole log once to count what the cut would drop and then the
cut read it again; now the attempt row is made from the rows the cut returns (one read).
Both sequences run side by side on the same log (a long run's: N step rows of the shape
`trainguard run` writes), each on a fresh copy, alternating which goes first; medians of the
rounds and their ratio.

    python benchmarks/bench_resume_log.py [--rows 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from machine import describe

from trainguard.goodput.rows import attempt_row
from trainguard.metrics.jsonl import MetricsLog, read_metrics

ROW = {
    "kind": "step",
    "loss": 2.345678,
    "grad_norm": 0.98765,
    "lr": 0.0003,
    "tokens": 65536,
    "data_time_s": 0.0012,
    "step_time_s": 0.41,
    "position": 123456,
    "batch_hash": "0123456789abcdef",
    "action": "apply",
}


def build(folder: Path, rows: int) -> None:
    with open(folder / "metrics.jsonl", "w", encoding="utf-8") as fh:
        for s in range(rows):
            fh.write(json.dumps({**ROW, "step": s, "time": 1.7e9 + 0.41 * s}) + "\n")


def before(run_dir: Path, resumed: int) -> float:
    t0 = time.perf_counter()
    row = attempt_row(read_metrics(run_dir), resumed, 0.0)  # the log read to count the cut
    log = MetricsLog(run_dir)
    log.truncate_after(resumed)  # and read again by the cut
    log.write(row)
    log.close()
    return time.perf_counter() - t0


def now(run_dir: Path, resumed: int) -> float:
    t0 = time.perf_counter()
    log = MetricsLog(run_dir)
    dropped = log.truncate_after(resumed)  # the one read
    log.write(attempt_row(dropped, resumed, 0.0))
    log.close()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lost", type=int, default=50, help="steps past the checkpoint")
    args = ap.parse_args()
    print(describe())
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        source.mkdir()
        build(source, args.rows)
        size = (source / "metrics.jsonl").stat().st_size / 2**20
        print(f"log: {args.rows} step rows, {size:.1f} MiB; resume {args.lost} steps back")
        times: dict[str, list[float]] = {"before": [], "now": []}
        for r in range(args.rounds):
            order = [("before", before), ("now", now)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                copy = Path(tmp) / f"{name}-{r}"
                shutil.copytree(source, copy)
                times[name].append(fn(copy, args.rows - args.lost))
                shutil.rmtree(copy)
        b, n = statistics.median(times["before"]), statistics.median(times["now"])
        for name, ts in times.items():
            each = ", ".join(f"{t:.3f}" for t in ts)
            print(f"{name:>6}: median {statistics.median(ts):.3f} s ({each})")
        print(f"ratio now / before: {n / b:.2f}")


if __name__ == "__main__":
    main()
