"""Restart to the first resumed step: `trainguard run` on a run dir with a checkpoint, timed from
launch to the resumed step's row in metrics.jsonl, against a bare `import torch` plus loading
the same checkpoint's files, in the same run.

A run of the recipe is first trained to step N (`--set train.max_steps=N`, a checkpoint at the
end); each round copies it and launches `python -m trainguard run RECIPE --set
train.max_steps=N+1`, which resumes from step N and computes step N+1. The clock stops when
step N+1's row is in metrics.jsonl; the process is then interrupted (the rest of a run, the final
evaluation and the report, is not a restart's cost). Three variants:

    resume          the run dir as a run leaves it (pre-flight results cached in it)
    resume, cold    the same without RUN_DIR/preflight_cache.json: every pre-flight check runs
                    (what a restart cost before the cache)
    floor           `python -c "import torch"` + reading the same checkpoint's state.json and
                    state.safetensors: the least any restart pays

With `--baseline-rev REV` a fourth variant, `resume, REV`, runs the same resume on the code of
git revision REV (its `src/` exported to a temporary folder), in the same rounds as `resume`
and alternating which goes first: old vs new side by side on a shared machine. The baseline
resumes a run dir its own code trained (the pre-flight cache is keyed by the code). Both trees are
byte-compiled first, so neither pays for compiling its sources (PYTHONDONTWRITEBYTECODE would
otherwise make every launch compile them).

Each is reported as wall seconds and as the CPU seconds the process used until then (user +
system, from /proc on Linux): on a shared machine the CPU figure moves less.

The machine (CPU model and flags, cores, load) is printed first.

    python benchmarks/bench_restart.py [--recipe default] [--steps 1] [--rounds 3]
        [--baseline-rev REV] [--no-cold]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import describe

SRC = Path(__file__).resolve().parent.parent / "src"

FLOOR = """
import json
import sys
import torch
from safetensors.torch import load_file
folder = sys.argv[1]
json.loads(open(folder + "/state.json").read())
load_file(folder + "/state.safetensors")
"""


def _cli(recipe: str, run_dir: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "trainguard", "run", recipe, "--run-dir", str(run_dir)] + [
        "--set",
        f"train.max_steps={steps}",
        "-q",
    ]


def _has_step(metrics: Path, step: int) -> bool:
    """Whether `step` steps have their rows: counted, not looked up by number, so that a
    baseline revision that numbered its rows from 1 is timed to the same step."""
    try:
        text = metrics.read_text(encoding="utf-8")
    except OSError:
        return False
    done = set()
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a row being written
        if row.get("kind") == "step":
            done.add(row.get("step"))
    return len(done) >= step


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _env(src: Path) -> dict[str, str]:
    """The environment of a launch that imports trainguard from `src`."""
    return {**os.environ, "PYTHONPATH": str(src)}


def export_src(rev: str, into: Path) -> Path:
    """`src/` of git revision `rev`, exported into `into` and byte-compiled; returns its path."""
    archive = subprocess.run(
        ["git", "-C", str(SRC.parent), "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    compileall.compile_dir(into / "src", quiet=1)
    return into / "src"


def time_restart(
    recipe: str, run_dir: Path, step: int, timeout: float = 600, src: Path = SRC
) -> tuple[float, float]:
    """Seconds from launch to step `step`'s row, and the CPU seconds the process had used by
    then (a figure a loaded machine changes less); the process is then interrupted."""
    metrics = run_dir / "metrics.jsonl"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        _cli(recipe, run_dir, step),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_env(src),
    )
    try:
        while not _has_step(metrics, step):
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise SystemExit(f"the resumed run exited {proc.returncode}:\n{err[-3000:]}")
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"no row for step {step} within {timeout:.0f} s")
            time.sleep(0.01)
        return time.perf_counter() - t0, cpu_seconds(proc.pid)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def time_floor(checkpoint: Path) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", FLOOR, str(checkpoint)], check=True)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="default")
    parser.add_argument("--steps", type=int, default=1, help="steps trained before restarting")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--baseline-rev", help="also resume on this git revision's code, in the same rounds"
    )
    parser.add_argument(
        "--no-cold", action="store_true", help="leave out `resume, cold` (every check runs)"
    )
    args = parser.parse_args()
    print(describe())
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    n = args.steps
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        base = Path(tmp) / "trained"
        compileall.compile_dir(SRC, quiet=1)
        old_src = export_src(args.baseline_rev, Path(tmp)) if args.baseline_rev else None
        t0 = time.perf_counter()
        subprocess.run(
            _cli(args.recipe, base, n), check=True, stdout=subprocess.DEVNULL, env=_env(SRC)
        )
        print(f"trained {args.recipe} to step {n} in {time.perf_counter() - t0:.1f} s")
        # The baseline trains its own run dir: the pre-flight cache is keyed by the code's
        # version (checks/preflight_cache.py), so the new code's cache would make it run cold.
        old_base = Path(tmp) / "trained-baseline"
        if old_src is not None:
            subprocess.run(
                _cli(args.recipe, old_base, n),
                check=True,
                stdout=subprocess.DEVNULL,
                env=_env(old_src),
            )
        checkpoint = base / "checkpoints" / f"step-{n}"
        if not (checkpoint / "manifest.json").exists():
            raise SystemExit(f"no checkpoint at {checkpoint}: is {n} a checkpoint step?")
        old = f"resume, {args.baseline_rev}"
        times: dict[str, list[tuple[float, float]]] = {"resume": []}
        if old_src is not None:
            times[old] = []
        if not args.no_cold:
            times["resume, cold"] = []
        times["floor"] = []
        for i in range(args.rounds):
            order = ["resume", old] if old_src is not None else ["resume"]
            if i % 2:
                order.reverse()  # neither side always runs right after the other
            for variant in (*order, *(["resume, cold"] if not args.no_cold else [])):
                run_dir = Path(tmp) / f"round-{i}-{list(times).index(variant)}"
                shutil.copytree(old_base if variant == old else base, run_dir)
                if variant == "resume, cold":
                    (run_dir / "preflight_cache.json").unlink()
                src = old_src if variant == old and old_src is not None else SRC
                times[variant].append(time_restart(args.recipe, run_dir, n + 1, src=src))
                shutil.rmtree(run_dir)
            times["floor"].append(time_floor(checkpoint))
    floor = statistics.median(w for w, _ in times["floor"])
    floor_cpu = statistics.median(c for _, c in times["floor"])
    print(f"\nrecipe {args.recipe}, restart from step {n}, {args.rounds} rounds (medians)")
    head = ("variant", "wall s", "min s", "vs floor", "CPU s", "vs floor")
    print("{:14s} {:>7s} {:>7s} {:>9s} {:>7s} {:>9s}".format(*head))
    for name, values in times.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        low = min(w for w, _ in values)
        print(
            f"{name:14s} {wall:7.2f} {low:7.2f} {wall / floor:8.2f}x {cpu:7.2f} "
            f"{cpu / floor_cpu:8.2f}x"
        )
    if old_src is not None:
        for label, index in (("wall", 0), ("CPU", 1)):
            new_m = statistics.median(v[index] for v in times["resume"])
            old_m = statistics.median(v[index] for v in times[old])
            print(f"resume / {old} ({label}, medians): {new_m / old_m:.3f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
