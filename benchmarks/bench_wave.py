"""Faint-wave detection (R105): detection rate and false-alarm rate over many seeds.

A faint wave: relative amplitude 0.5% (also 0.3% and 1%), period drawn uniformly in 30-100
steps, on a decreasing loss with 2% per-batch noise (warm-up of 100 steps; a cosine schedule on
odd seeds, heavy-tailed noise on every third), as in tests/test_monitors.py. Two detectors over
the same curves, fed step by step as in a run:
- `single window`: the oscillation detector without the faint-wave test (the detector as it was:
  Fisher's g-test on the last 1024 rows every 128 rows);
- `with faint-wave test`: the shipped detector (steps 1-6 of guard/detectors/oscillation.py).
A detection is an R105 whose period is within 10% of the planted one (a strong wave is
reported early, from a partial window, with a coarser period). False alarms: any R105 on
clean curves of every kind tests/test_monitors.py uses (smooth, 2% and 5% Gaussian noise,
heavy tails, warm-up, cosine schedules), seeds disjoint from the tests'. The in-run cost is the
detector's time per `update` on a clean curve.

    python benchmarks/bench_wave.py [--seeds 200] [--write docs/benchmarks/wave.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from machine import describe

from trainguard.guard.detectors import synthetic as S
from trainguard.guard.detectors.oscillation import OscillationDetector

LENGTHS = (2000, 3000, 5000, 10000)
AMPLITUDES = (0.003, 0.005, 0.01)
CLEAN = {
    "smooth": dict(noise=0.0),
    "gaussian 2%": dict(noise=0.02),
    "gaussian 5%": dict(noise=0.05),
    "heavy-tailed 2%": dict(noise=0.02, heavy_tails=True),
    "warm-up 2%": dict(noise=0.02, warmup=100),
    "warm-up, smooth": dict(noise=0.0, warmup=50),
    "warm-up, cosine, heavy 2%": dict(noise=0.02, warmup=100, cosine=True, heavy_tails=True),
    "cosine 0.5%": dict(noise=0.005, cosine=True),
    "warm-up, cosine 1%": dict(noise=0.01, cosine=True, warmup=200),
}


class SingleWindow(OscillationDetector):
    """The detector without the faint-wave test (nor the long-period test): one window only."""

    def _block(self, step: int) -> list:
        return []

    def _slow(self, step: int) -> list:
        return []


DETECTORS = {"single window": SingleWindow, "with faint-wave test": OscillationDetector}


def findings(cls, loss: np.ndarray) -> tuple[list, float]:
    det = cls()
    out = []
    t = time.perf_counter()
    for i, x in enumerate(loss.tolist()):
        out += det.update(i, {"loss": x})
    seconds = time.perf_counter() - t
    return out + det.finalize(), seconds


def wave_curve(n: int, seed: int, amplitude: float) -> tuple[np.ndarray, float]:
    period = float(np.random.default_rng(1000 + seed).uniform(30, 100))
    base = S.clean_loss(
        n, seed=seed, noise=0.02, warmup=100, cosine=bool(seed % 2), heavy_tails=seed % 3 == 0
    )
    return S.plant_wave(base, period, amplitude), period


def detection(n: int, amplitude: float, seeds: range) -> dict[str, dict[str, float]]:
    out = {}
    for name, cls in DETECTORS.items():
        hits, errors = 0, []
        for seed in seeds:
            loss, period = wave_curve(n, seed, amplitude)
            found, _ = findings(cls, loss)
            periods = [f.data["period_steps"] for f in found]
            good = [p for p in periods if abs(p - period) <= 0.1 * period]
            if good:
                hits += 1
                errors.append(abs(good[0] - period) / period)
        out[name] = {
            "rate": hits / len(seeds),
            "median_period_error": statistics.median(errors) if errors else float("nan"),
        }
    return out


def false_alarms(n: int, seeds: range) -> dict[str, tuple[int, int]]:
    out = {}
    for name, kw in CLEAN.items():
        alarms = sum(
            bool(findings(OscillationDetector, S.clean_loss(n, seed=5000 + s, **kw))[0])
            for s in seeds
        )
        out[name] = (alarms, len(seeds))
    return out


def cost(n: int = 10000, repeats: int = 5) -> dict[str, float]:
    loss = S.clean_loss(n, seed=1, noise=0.02, warmup=100)
    times: dict[str, list[float]] = {k: [] for k in DETECTORS}
    for _ in range(repeats):
        for name, cls in DETECTORS.items():  # interleaved: machine noise hits both alike
            times[name].append(findings(cls, loss)[1] / n * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def markdown(det: dict, amp: dict, fa: dict, costs: dict, seeds: int, command: str) -> str:
    lines = [
        "## Faint waves in the loss (R105)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine (at the end): {describe()}; numpy {np.__version__}.",
        "",
        f"Detection of a 0.5% wave (period 30-100 steps, 2% noise), {seeds} seeds per length; "
        "a detection is an R105 naming the period within 10%:",
        "",
        "| steps | single window | with faint-wave test | median period error |",
        "|---|---|---|---|",
    ]
    for n, r in det.items():
        a, b = r["single window"], r["with faint-wave test"]
        lines.append(
            f"| {n} | {a['rate']:.1%} | {b['rate']:.1%} | {b['median_period_error']:.2%} |"
        )
    lines += [
        "",
        f"Amplitude sweep at 5000 steps, {seeds} seeds:",
        "",
        "| relative amplitude | single window | with faint-wave test |",
        "|---|---|---|",
    ]
    for a, r in amp.items():
        lines.append(
            f"| {a:.1%} | {r['single window']['rate']:.1%} | "
            f"{r['with faint-wave test']['rate']:.1%} |"
        )
    total = sum(k for k, _ in fa.values())
    runs = sum(n for _, n in fa.values())
    bound = 3.0 / runs if total == 0 else float("nan")
    lines += [
        "",
        "False alarms of the shipped detector on clean curves (any R105), 5000 and 10000 steps:",
        "",
        "| clean curve | false alarms |",
        "|---|---|",
    ]
    lines += [f"| {name} | {k} of {n} |" for name, (k, n) in fa.items()]
    lines += [
        "",
        f"In all: {total} of {runs} clean curves"
        + (
            f" (95% upper bound on the rate: {bound:.2%}, the rule of three)."
            if total == 0
            else "."
        )
        + "",
        "",
        "In-run cost of `update` per step on a 10,000-step curve (median of 5, interleaved): "
        + ", ".join(f"{k} {v:.1f} us" for k, v in costs.items())
        + ".",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    print(describe(), flush=True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    seeds = range(args.seeds)
    det = {n: detection(n, 0.005, seeds) for n in LENGTHS}
    print(det, flush=True)
    amp = {a: detection(5000, a, seeds) for a in AMPLITUDES}
    print(amp, flush=True)
    fa = {}
    for n in (5000, 10000):
        for name, counts in false_alarms(n, seeds).items():
            k, m = fa.get(name, (0, 0))
            fa[name] = (k + counts[0], m + counts[1])
    print(fa, flush=True)
    costs = cost()
    command = "python " + " ".join(["benchmarks/bench_wave.py", *sys.argv[1:]])
    text = markdown(det, amp, fa, costs, args.seeds, command)
    print(text)
    if args.write:
        args.write.write_text("# Benchmarks: faint waves\n\n" + text)


if __name__ == "__main__":
    main()
