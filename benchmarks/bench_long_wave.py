"""Long faint waves (R105): detection and false-alarm rates over many seeds, new vs old detector.

A long faint wave: relative amplitude 1%, 1.5% or 2%, period 50-500 steps, on a decreasing loss
with 3% per-batch noise: warm-up of 100 steps, a cosine schedule on odd seeds, and the noise
white, heavy-tailed (Student-t), heteroscedastic (its std following the loss's fall, 2x to 0.5x)
or AR(1)-correlated (0.5) by seed (synthetic.clean_loss). Two detectors over the same curves,
fed step by step as in a run, finalize included (as `trainguard watch` does):
- `old`: the detector as it was before this test (commit eea597e, read with `git show`: one
  window's Fisher g-test and the faint-wave test over joined blocks, both against the whole
  band's noise level);
- `no long test`: the shipped detector without the long-period test (its window and block tests
  judge a peak against its neighbouring bins, spectral.local_peak);
- `new`: the shipped detector (oscillation.py with slow_wave.py).
A detection is an R105 whose period is within 10% of the planted one; the amplitude error is
the reported amplitude of that finding over the planted one. False alarms: any R105 on clean
curves, the kinds of bench_wave.py plus 3% noise that is white, heteroscedastic or AR(1) with
0.5, 0.8 and 0.9, seeds disjoint from the tests'. The in-run cost is the time per `update` on a
clean 10,000-step curve, the two detectors interleaved.

    python benchmarks/bench_long_wave.py [--seeds 100] [--fa-seeds 100]
        [--write docs/benchmarks/long_wave.md]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
from bench_wave import CLEAN as WAVE_CLEAN
from machine import describe

from trainguard.guard.detectors import synthetic as S
from trainguard.guard.detectors.oscillation import OscillationDetector

PERIODS = (50, 100, 200, 300, 400, 500)
AMPLITUDES = (0.01, 0.015, 0.02)
N = 3000
LENGTHS = (1500, 2000, 3000, 6000)
LONGEST = {4000: (800, 1000, 1300)}  # periods near a third of the curve
NOISE = 0.03
NOISE_KINDS = (
    ("white", {}),
    ("heavy-tailed", {"heavy_tails": True}),
    ("heteroscedastic", {"hetero": True}),
    ("AR(1) 0.5", {"ar1": 0.5}),
)
CLEAN = {
    **WAVE_CLEAN,  # the nine clean kinds of bench_wave.py, plus the long and correlated ones
    "warm-up, cosine 3%": dict(noise=0.03, warmup=100, cosine=True),
    "heteroscedastic 3%": dict(noise=0.03, warmup=100, cosine=True, hetero=True),
    "AR(1) 0.5, 3%": dict(noise=0.03, warmup=100, cosine=True, ar1=0.5),
    "AR(1) 0.8, 3%": dict(noise=0.03, warmup=100, cosine=True, ar1=0.8),
    "AR(1) 0.9, 3%": dict(noise=0.03, warmup=100, ar1=0.9),
}
FA_LENGTHS = (3000, 10000)


BASELINE = "eea597e"
"""The commit before the long-period test: its oscillation.py is the `old` detector."""


def old_detector() -> type:
    """OscillationDetector as it was at BASELINE (it imports only numpy and trainguard.findings)."""
    src = subprocess.run(
        ["git", "show", f"{BASELINE}:src/trainguard/guard/detectors/oscillation.py"],
        cwd=Path(__file__).resolve().parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("oscillation_before")
    exec(compile(src, "oscillation_before.py", "exec"), module.__dict__)
    return module.OscillationDetector


class NoLongTest(OscillationDetector):
    """The shipped detector without the long-period test."""

    def _slow(self, step: int) -> list:
        return []


DETECTORS = {"old": old_detector(), "no long test": NoLongTest, "new": OscillationDetector}


def findings(loss: np.ndarray) -> dict[str, list]:
    """Every R105 of each detector on one curve, finalize included."""
    out = {}
    for name, cls in DETECTORS.items():
        det, found = cls(), []
        for i, x in enumerate(loss.tolist()):
            found += det.update(i, {"loss": x})
        out[name] = found + det.finalize()
    return out


def wave_curve(n: int, seed: int, amplitude: float, period: float) -> np.ndarray:
    _, kind = NOISE_KINDS[seed % len(NOISE_KINDS)]
    base = S.clean_loss(n, seed=seed, noise=NOISE, warmup=100, cosine=bool(seed % 2), **kind)
    return S.plant_wave(base, period, amplitude)


def detection(n: int, amplitude: float, period: float, seeds: range) -> dict[str, dict]:
    out: dict[str, dict] = {
        k: {"hits": 0, "period_errors": [], "amplitude_ratios": [], "by_kind": {}}
        for k in DETECTORS
    }
    for seed in seeds:
        kind = NOISE_KINDS[seed % len(NOISE_KINDS)][0]
        for name, found in findings(wave_curve(n, seed, amplitude, period)).items():
            good = [f for f in found if abs(f.data["period_steps"] - period) <= 0.1 * period]
            hits, tries = out[name]["by_kind"].get(kind, (0, 0))
            out[name]["by_kind"][kind] = (hits + bool(good), tries + 1)
            if good:
                r = out[name]
                r["hits"] += 1
                r["period_errors"].append(abs(good[0].data["period_steps"] - period) / period)
                r["amplitude_ratios"].append(good[0].data["amplitude"] / amplitude)
    for r in out.values():
        r["rate"] = r["hits"] / len(seeds)
    return out


def false_alarms(seeds: range) -> dict[str, dict[str, tuple[int, int]]]:
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for name, kw in CLEAN.items():
        counts = dict.fromkeys(DETECTORS, 0)
        for n in FA_LENGTHS:
            for s in seeds:
                for det, found in findings(S.clean_loss(n, seed=7000 + s, **kw)).items():
                    counts[det] += bool(found)
        out[name] = {k: (v, len(seeds) * len(FA_LENGTHS)) for k, v in counts.items()}
        print(name, out[name], flush=True)
    return out


def cost(n: int = 10000, repeats: int = 5) -> dict[str, float]:
    loss = S.clean_loss(n, seed=1, noise=0.03, warmup=100, cosine=True)
    times: dict[str, list[float]] = {k: [] for k in DETECTORS}
    for _ in range(repeats):
        for name, cls in DETECTORS.items():  # interleaved: machine noise hits both alike
            det = cls()
            t = time.perf_counter()
            for i, x in enumerate(loss.tolist()):
                det.update(i, {"loss": x})
            times[name].append((time.perf_counter() - t) / n * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def _med(xs: list[float], pct: bool = True) -> str:
    if not xs:
        return "-"
    m = statistics.median(xs)
    return f"{m:.1%}" if pct else f"{m:.2f}"


def _range(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-"


def markdown(grid, lengths, longest, fa, costs, seeds, fa_seeds, command) -> str:
    lines = [
        "## Long faint waves in the loss (R105)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine (at the end): {describe()}; numpy {np.__version__}.",
        "",
        f"Detection at {N} steps under {NOISE:.0%} noise (white, heavy-tailed, heteroscedastic "
        f"or AR(1) 0.5 by seed; warm-up 100, cosine on odd seeds), {seeds} seeds per cell; a "
        "detection is an R105 naming the period within 10%; old / new detector, then the new "
        "one's median period error and median (min-max) reported / planted amplitude:",
        "",
        "| amplitude | period | old | no long test | new | period error | amplitude ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for (amp, period), r in grid.items():
        o, m, w = r["old"], r["no long test"], r["new"]
        lines.append(
            f"| {amp:.1%} | {period} | {o['rate']:.0%} | {m['rate']:.0%} | **{w['rate']:.0%}** | "
            f"{_med(w['period_errors'])} | {_med(w['amplitude_ratios'], False)} "
            f"({_range(w['amplitude_ratios'])}) |"
        )
    lines += ["", "Detection over the whole grid by noise kind:", ""]
    lines += ["| noise | old | no long test | new |", "|---|---|---|---|"]
    for kind, _ in NOISE_KINDS:
        cells = {d: [r[d]["by_kind"].get(kind, (0, 0)) for r in grid.values()] for d in DETECTORS}
        rates = {d: sum(h for h, _ in c) / max(sum(t for _, t in c), 1) for d, c in cells.items()}
        lines.append(
            f"| {kind} | {rates['old']:.1%} | {rates['no long test']:.1%} | "
            f"**{rates['new']:.1%}** |"
        )
    lines += [
        "",
        f"Curve length, 1.5% wave of period 400 (same noise kinds), {seeds} seeds:",
        "",
        "| steps | old | no long test | new | period error |",
        "|---|---|---|---|---|",
    ]
    for n, r in lengths.items():
        lines.append(
            f"| {n} | {r['old']['rate']:.0%} | {r['no long test']['rate']:.0%} | "
            f"**{r['new']['rate']:.0%}** | "
            f"{_med(r['new']['period_errors'])} |"
        )
    lines += [
        "",
        f"The longest periods, 2% wave on 4000-step curves, {seeds} seeds:",
        "",
        "| period | old | no long test | new | period error |",
        "|---|---|---|---|---|",
    ]
    for p, r in longest.items():
        lines.append(
            f"| {p} | {r['old']['rate']:.0%} | {r['no long test']['rate']:.0%} | "
            f"**{r['new']['rate']:.0%}** | "
            f"{_med(r['new']['period_errors'])} |"
        )
    lines += [
        "",
        f"False alarms on clean curves (any R105), {fa_seeds} seeds at each of "
        f"{' and '.join(map(str, FA_LENGTHS))} steps:",
        "",
        "| clean curve | old | no long test | new |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {k} | " + " | ".join(f"{v[d][0]} of {v[d][1]}" for d in DETECTORS) + " |"
        for k, v in fa.items()
    ]
    for name in DETECTORS:
        total = sum(v[name][0] for v in fa.values())
        runs = sum(v[name][1] for v in fa.values())
        bound = f" (95% upper bound on the rate: {3.0 / runs:.2%}, the rule of three)"
        lines += ["", f"In all, {name}: {total} of {runs} clean curves{'' if total else bound}."]
    lines += [
        "",
        "In-run cost of `update` per step on a clean 10,000-step curve (median of 5, "
        "interleaved): " + ", ".join(f"{k} {v:.1f} us" for k, v in costs.items()) + ".",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    print(describe(), flush=True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--fa-seeds", type=int, default=100)
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    seeds, fa_seeds = range(args.seeds), range(args.fa_seeds)
    grid = {}
    for amp in AMPLITUDES:
        for period in PERIODS:
            grid[(amp, period)] = detection(N, amp, period, seeds)
            print(amp, period, {k: v["rate"] for k, v in grid[(amp, period)].items()}, flush=True)
    lengths = {n: detection(n, 0.015, 400, seeds) for n in LENGTHS}
    print({n: {k: v["rate"] for k, v in r.items()} for n, r in lengths.items()}, flush=True)
    longest = {p: detection(n, 0.02, p, seeds) for n, ps in LONGEST.items() for p in ps}
    print({p: {k: v["rate"] for k, v in r.items()} for p, r in longest.items()}, flush=True)
    fa = false_alarms(fa_seeds)
    costs = cost()
    command = "python " + " ".join(["benchmarks/bench_long_wave.py", *sys.argv[1:]])
    text = markdown(grid, lengths, longest, fa, costs, args.seeds, args.fa_seeds, command)
    print(text)
    if args.write:
        args.write.write_text("# Benchmarks: long faint waves\n\n" + text)


if __name__ == "__main__":
    main()
