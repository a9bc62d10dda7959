"""Detector cost per step: all detectors (MonitorSet), Guard.step, Watchdog.heartbeat,
against a bare loop that builds the same metrics and calls a function doing nothing.

    python benchmarks/bench_monitors.py [--steps 5000] [--repeats 7] \
        [--write docs/benchmarks/monitors.md]

Candidates and baseline run interleaved in the same process, `repeats` times each over the
same synthetic curves (loss with warm-up and noise, grad norm, tokens/s); the figures are
medians of the per-step time in microseconds. The oscillation test (an FFT every 128 rows) is
included, so the per-step cost is the amortised one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from machine import describe

from trainguard.guard.core import Guard
from trainguard.guard.detectors import synthetic as S
from trainguard.guard.detectors.monitor_set import MonitorSet
from trainguard.guard.watchdog import Watchdog


def _curves(n: int):
    loss = S.clean_loss(n, seed=0, warmup=100, noise=0.02).tolist()
    grad = S.clean_grad_norm(n).tolist()
    tps = S.clean_throughput(n).tolist()
    return loss, grad, tps


def bare(loss, grad, tps) -> float:
    def nothing(step, metrics):
        return []

    t = time.perf_counter()
    for i in range(len(loss)):
        nothing(i, {"loss": loss[i], "grad_norm": grad[i], "tokens_per_s": tps[i]})
    return time.perf_counter() - t


def monitor_set(loss, grad, tps) -> float:
    ms = MonitorSet()
    t = time.perf_counter()
    for i in range(len(loss)):
        ms.update(i, {"loss": loss[i], "grad_norm": grad[i], "tokens_per_s": tps[i]})
    return time.perf_counter() - t


def guard_step(loss, grad, tps) -> float:
    g = Guard()
    t = time.perf_counter()
    for i in range(len(loss)):
        g.step(i, loss=loss[i], grad_norm=grad[i], tokens_per_s=tps[i])
    return time.perf_counter() - t


def heartbeat(loss, grad, tps, tmp=Path("/tmp/trainguard-bench-watchdog")) -> float:
    wd = Watchdog(tmp, floor_s=600.0)  # thread not started: the loop-side cost only
    t = time.perf_counter()
    for i in range(len(loss)):
        with wd.phase("forward"):
            pass
        wd.heartbeat(i)
    return time.perf_counter() - t


CANDIDATES = {
    "bare loop (baseline)": bare,
    "MonitorSet.update (all detectors)": monitor_set,
    "Guard.step (detectors + actions)": guard_step,
    "Watchdog phase + heartbeat": heartbeat,
}


def run(steps: int, repeats: int) -> dict[str, float]:
    curves = _curves(steps)
    times: dict[str, list[float]] = {k: [] for k in CANDIDATES}
    for _ in range(repeats):
        for name, fn in CANDIDATES.items():  # interleaved: machine noise hits all alike
            times[name].append(fn(*curves) / steps * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def markdown(med: dict[str, float], steps: int, repeats: int, command: str) -> str:
    base = med["bare loop (baseline)"]
    lines = [
        "## Detector cost per step",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {describe()}; numpy {np.__version__}; {steps} steps, median of {repeats} "
        "interleaved repeats.",
        "",
        "| what | µs per step (median) | extra over the bare loop |",
        "|---|---|---|",
    ]
    for name, v in med.items():
        extra = "-" if name.startswith("bare") else f"+{v - base:.1f} µs ({v / base:.1f}x)"
        lines.append(f"| {name} | {v:.2f} | {extra} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    print(describe())
    med = run(args.steps, args.repeats)
    base = med["bare loop (baseline)"]
    for name, v in med.items():
        print(f"{name:40s} {v:8.2f} us/step   ratio {v / base:6.1f}x")
    if args.write:
        command = "python " + " ".join(["benchmarks/bench_monitors.py", *sys.argv[1:]])
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(markdown(med, args.steps, args.repeats, command))
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
