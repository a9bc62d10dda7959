"""Multi-process training throughput: `trainguard run --nproc 2` against 1 process, and what
the multi-process guards cost.

Variants, each a real `trainguard run` in a fresh run dir, interleaved round by round (the
order rotating) so that machine noise hits all of them:

    1 process                   the baseline (train.threads=1: one core)
    2 processes                 DDP over gloo on 127.0.0.1, default guards (replica check
                                every 50 steps, straggler timings every 20, a monitored
                                barrier at every step boundary after warm-up)
    2 processes, checks every step   replica hashes and straggler timings gathered every step:
                                the worst case of the guards' cost

Throughput is taken from each run's metric log: tokens between the step rows of step
`--skip` and the last step, over the wall time between them (start-up, data preparation and
the final evaluation excluded). Printed: medians and ratios to the 1-process baseline; with
`--markdown PATH` a section for docs/benchmarks.

    python benchmarks/bench_distributed.py [--steps 40] [--rounds 3] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from machine import describe

VARIANTS: dict[str, list[str]] = {
    "1 process": [],
    "2 processes": ["--nproc", "2"],
    "2 processes, checks every step": [
        "--nproc",
        "2",
        "--set",
        "distributed.replica_check_interval=1",
        "--set",
        "distributed.straggler_interval=1",
    ],
}


def recipe(corpus: Path, cache: Path, steps: int) -> dict:
    return {
        "name": "bench-dist",
        "data": {
            "source": str(corpus),
            "seq_len": 64,
            "val_fraction": 0.1,
            "cache_dir": str(cache),
        },
        "tokenizer": {"vocab_size": 1024},
        "model": {"n_layers": 2, "d_model": 128, "n_heads": 4},
        "train": {
            "max_steps": steps,
            "batch_size": 16,
            "warmup_steps": 2,
            "eval_interval": 10_000,
            "eval_batches": 1,
            "threads": 1,
        },
        "checkpoint": {"interval": 10_000},
        "preflight": {"enabled": False},
    }


def small_corpus(out: Path) -> Path:
    import shutil
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for module in ("json", "email", "html", "http", "urllib", "logging"):
        for path in sorted((stdlib / module).glob("*.py")):
            dest = out / path.relative_to(stdlib)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
    return out


def throughput(run_dir: Path, skip: int) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("kind") == "step" and r["step"] >= skip]
    tokens = sum(r["tokens_per_s"] * r["step_time_s"] for r in steps[1:])
    return tokens / (steps[-1]["time"] - steps[0]["time"])


def run_once(recipe_path: Path, run_dir: Path, extra: list[str], skip: int) -> float:
    env = {**os.environ, "CI": "1", "OMP_NUM_THREADS": "1"}
    env.pop("TRAINGUARD_INJECT", None)
    cmd = [sys.executable, "-m", "trainguard", "run", str(recipe_path), "--run-dir", str(run_dir)]
    res = subprocess.run([*cmd, "-q", *extra], env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"run failed ({extra}):\n{res.stderr[-3000:]}")
    return throughput(run_dir, skip)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    print(describe())

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        path = base / "bench.yaml"
        r = recipe(small_corpus(base / "corpus"), base / "cache", args.steps)
        path.write_text(yaml.safe_dump(r))
        run_once(path, base / "prepare", [], args.skip)  # data preparation, not measured
        results: dict[str, list[float]] = {name: [] for name in VARIANTS}
        names = list(VARIANTS)
        for k in range(args.rounds):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                t0 = time.perf_counter()
                tps = run_once(
                    path, base / f"run-{k}-{names.index(name)}", VARIANTS[name], args.skip
                )
                results[name].append(tps)
                print(
                    f"round {k + 1}: {name}: {tps:,.0f} tokens/s ({time.perf_counter() - t0:.0f}s)"
                )

    base_med = statistics.median(results["1 process"])
    lines = [
        "| variant | median tokens/s | runs | ratio to 1 process |",
        "|---|---:|---|---:|",
    ]
    for name, values in results.items():
        med = statistics.median(values)
        runs = ", ".join(f"{v:,.0f}" for v in values)
        lines.append(f"| {name} | {med:,.0f} | {runs} | {med / base_med:.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        cmd = " ".join(["python", "benchmarks/bench_distributed.py", *sys.argv[1:]])
        args.markdown.write_text(
            "## Multi-process training\n\n"
            f"Command: `{cmd}`\n\n"
            f"Machine: {describe()}, {platform.platform()}, "
            f"{time.strftime('%Y-%m-%d')}. Model: 2 layers, d_model 128, seq_len 64, global "
            f"batch 16, {args.steps} steps, throughput over steps {args.skip}..{args.steps}.\n\n"
            f"{table}\n"
        )


if __name__ == "__main__":
    main()
