"""Every benchmark at small settings, one after the other, and a summary table (`make bench`).

Small settings check that each script still runs end to end and give rough figures in minutes;
the figures in docs/benchmarks.md come from the commands quoted there, at full size. Each
benchmark runs in its own process; a failure is a row (with its last output lines), not the
end of the sweep. The exit status is 1 when any benchmark failed.

    python benchmarks/run_all.py [--only NAME ...] [--out runs/bench/summary.md]
        [--timeout 900]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from machine import describe

HERE = Path(__file__).resolve().parent

# Each benchmark with its small settings: seconds to a few minutes each on 2 cores.
BENCHMARKS: dict[str, list[str]] = {
    "bench_monitors": ["--steps", "1000", "--repeats", "3"],
    "bench_guard_sync": [
        *("--steps", "10", "--rounds", "2", "--d-model", "128", "--layers", "2"),
        *("--batch", "4", "--seq", "64"),
    ],
    "bench_order": ["--repeats", "3"],
    "bench_optimizer": ["--configs", "", "--rounds", "3"],
    "bench_tokenizer_audit": [
        *("--vocab", "5000", "--train-mb", "2", "--docs", "50", "--repeats", "1"),
    ],
    "bench_check_model": ["--repeats", "1", "--threads", "1"],
    "bench_checkpoint": ["--mb", "8", "--s3-mb", "2", "--repeats", "3"],
    "bench_checkpointer": ["--mb", "4", "--rounds", "2", "--no-storm"],
    "bench_doctor": ["--repeats", "1"],
    "bench_scaling": ["--runs", "12", "--boot", "20", "--repeats", "1"],
    "bench_evals": ["--examples", "20", "--repeats", "1"],
    "bench_dedup": ["--docs", "500", "--repeats", "1"],
    "bench_contamination": ["--examples", "10", "--background", "300", "--repeats", "1"],
    "bench_train_throughput": ["--steps", "10", "--rounds", "1"],
    "bench_run_rebuild": ["--steps", "20", "--rounds", "1"],
    "bench_checkpoint_format": ["--rounds", "1"],
    "bench_run_checkpoint_stall": ["--steps", "8", "--interval", "4", "--rounds", "1"],
    "bench_distributed": ["--steps", "10", "--skip", "2", "--rounds", "1"],
    "bench_wave": ["--seeds", "5"],
    "bench_long_wave": ["--seeds", "3", "--fa-seeds", "3"],
    "bench_stragglers": ["--seeds", "5", "--ranks", "2", "--real", "0"],
    "bench_restart": ["--rounds", "1"],
    "bench_resume_log": ["--rows", "20000", "--rounds", "3"],
    "bench_ablate": ["--seeds", "2", "--steps", "10"],
}


def tail(text: str, lines: int = 3, chars: int = 300) -> str:
    """The output's last lines on one line (a table cell), cut to `chars`."""
    kept = [" ".join(ln.split()) for ln in text.strip().splitlines() if ln.strip()][-lines:]
    joined = " / ".join(kept)
    if len(joined) > chars:
        joined = "..." + joined[-chars:]
    return joined.replace("|", "\\|")


def run_one(name: str, timeout: float) -> dict[str, object]:
    args = [sys.executable, str(HERE / f"{name}.py"), *BENCHMARKS[name]]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, cwd=HERE.parent
        )
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        output = proc.stdout if proc.returncode == 0 else proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        status, output = f"timed out after {timeout:.0f} s", str(e.stdout or "")
    seconds = time.perf_counter() - start
    command = " ".join(["python", f"benchmarks/{name}.py", *(a or '""' for a in BENCHMARKS[name])])
    return {
        "name": name,
        "command": command,
        "status": status,
        "seconds": seconds,
        "last": tail(output),
    }


def summary(rows: list[dict[str, object]]) -> str:
    lines = [
        "# Benchmarks at small settings",
        "",
        f"Machine: {describe()}.",
        "",
        "Rough figures that show each script runs; docs/benchmarks.md has the full-size ones.",
        "",
        "| benchmark | command | status | seconds | last lines of its output |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | `{r['command']}` | {r['status']} | {r['seconds']:.0f} | {r['last']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=sorted(BENCHMARKS), default=None)
    ap.add_argument("--out", type=Path, default=None, help="also write the summary here")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per benchmark")
    args = ap.parse_args()
    rows = []
    for name in args.only or list(BENCHMARKS):
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows.append(run_one(name, args.timeout))
    text = summary(rows)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
