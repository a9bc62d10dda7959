"""`trainguard run` throughput of two checkouts, side by side: the code under test against an
older one (e.g. the run before it was rebuilt on the public parts).

Each round runs the same small recipe once with each checkout's `src` on PYTHONPATH, in a fresh
process and run dir, alternating which goes first (ABBA), so that machine noise hits both.
Each run's whole-process CPU seconds (user + system) are counted too: on a shared machine they
move less than wall time. Throughput is read from each run's own metric log: tokens between the
first and the last step row over the wall time between them (data preparation, pre-flight,
the final evaluation and the checkpoint write fall outside). Prints every round, the median
ratio (new / old) and its spread (quartiles, min-max), and the machine (CPU model, cores,
flags).

    python benchmarks/bench_run_rebuild.py [--old-rev REV | --old CHECKOUT] [--new .]
        [--steps 200] [--rounds 9] [--recipe default] [--interval 2]

`--recipe NAME` runs a shipped recipe (e.g. `default`) instead of the tiny one, `--interval N`
saves a checkpoint every N steps (checkpoint-heavy: the save's cost is inside the measured
window), both for old and new alike.

`--old-rev` (default: the parent of the commit that added `train/spine.py`, i.e. the last `run`
before the rebuild) is extracted with `git archive`; `--old` takes a checkout instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CORPUS = ("json", "email", "html", "http", "urllib", "logging", "xml/dom")
SPINE = "src/trainguard/train/spine.py"


REPO = Path(__file__).resolve().parents[1]


def before_rebuild() -> str:
    """The commit before the one that added the loop's spine (`train/spine.py`)."""
    added = subprocess.run(
        ["git", "-C", str(REPO), "log", "--diff-filter=A", "--format=%H", "--", SPINE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not added:
        raise SystemExit(f"no commit adds {SPINE} here: give --old-rev or --old")
    return f"{added[-1]}^"


def old_source(rev: str, folder: Path) -> Path:
    """The `src/` of commit `rev` of this repository, extracted into `folder` (`git archive`:
    the repository's worktrees and index are left alone)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "src"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def recipe(folder: Path, steps: int) -> Path:
    """The tests' tiny recipe on a slice of the standard library, `steps` long; evaluation and
    checkpoint only at the end, no pre-flight."""
    corpus = folder / "corpus"
    for module in CORPUS:
        for path in sorted((STDLIB / module).glob("*.py")):
            dest = corpus / path.relative_to(STDLIB)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes())
    doc = {
        "name": "bench",
        "data": {"source": str(corpus), "seq_len": 32, "cache_dir": str(folder / "cache")},
        "tokenizer": {"vocab_size": 512},
        "model": {"n_layers": 2, "d_model": 64, "n_heads": 2},
        "train": {
            "max_steps": steps,
            "batch_size": 8,
            "eval_interval": steps,
            "eval_batches": 1,
            "threads": 1,
            # The default peak (3e-3) makes this tiny model's gradient spike near step 45 of a
            # short schedule (R103 x3, a rollback): a run that trains, not one that halts.
            "lr": 1e-3,
        },
        "checkpoint": {"interval": steps, "keep": 1},
        "preflight": {"enabled": False},
    }
    path = folder / "bench.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


CPU: list[float] = []  # each run's CPU seconds (user + system of the process), in order


def tokens_per_s(src: Path, recipe_path: str, run_dir: Path, sets: list[str] = ()) -> float:
    env = {**os.environ, "PYTHONPATH": str(src), "CI": "1", "OMP_NUM_THREADS": "1"}
    env.pop("TRAINGUARD_INJECT", None)
    cmd = [sys.executable, "-m", "trainguard", "run", str(recipe_path), "--run-dir", str(run_dir)]
    for kv in sets:
        cmd += ["--set", kv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([*cmd, "-q", "--no-evals"], env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if res.returncode != 0:
        raise SystemExit(f"{src}: exit {res.returncode}\n{res.stderr[-2000:]}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [r for r in map(json.loads, lines) if r.get("kind") == "step"]
    ran = yaml.safe_load((run_dir / "recipe.yaml").read_text())  # the recipe as run
    t = ran["train"]
    tokens = (len(rows) - 1) * t["batch_size"] * t.get("grad_accum", 1) * ran["data"]["seq_len"]
    return tokens / (rows[-1]["time"] - rows[0]["time"])


def quartiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, help="an older checkout (its src/ is used)")
    ap.add_argument("--old-rev", help="or a commit of this repository (default: see above)")
    ap.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--recipe", help="a shipped recipe instead of the tiny one (e.g. default)")
    ap.add_argument("--interval", type=int, help="checkpoint.interval (default: at the end)")
    args = ap.parse_args()
    print(describe())
    with tempfile.TemporaryDirectory() as tmp:
        if args.old is not None:
            old = args.old.resolve() / "src"
        else:
            rev = args.old_rev or before_rebuild()
            old = old_source(rev, Path(tmp)) / "src"
            print(f"old: {rev} ({_describe_rev(rev)})")
        compare(
            old, args.new.resolve() / "src", args.steps, args.rounds, args.recipe, args.interval
        )


def _describe_rev(rev: str) -> str:
    cmd = ["git", "-C", str(REPO), "log", "-1", "--format=%h %s", rev]
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()[:80]


def compare(
    old: Path,
    new: Path,
    steps: int,
    rounds: int,
    shipped: str | None = None,
    interval: int | None = None,
) -> None:
    print(f"old src: {old}\nnew src: {new}")
    ratios, olds, news, cpus = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = shipped or str(recipe(folder, steps))
        sets = [f"train.max_steps={steps}"] if shipped else []
        if interval:
            sets.append(f"checkpoint.interval={interval}")
        print(f"recipe: {path} {' '.join(sets)}")
        tokens_per_s(new, path, folder / "warm", sets)  # prepares the data once, for both
        for r in range(rounds):
            order = [("old", old), ("new", new)] if r % 2 == 0 else [("new", new), ("old", old)]
            got = {
                name: tokens_per_s(src, path, folder / f"{name}-{r}", sets) for name, src in order
            }
            cpu = dict(zip([name for name, _ in order], CPU[-2:], strict=True))
            olds.append(got["old"])
            news.append(got["new"])
            ratios.append(got["new"] / got["old"])
            cpus.append(cpu["old"] / cpu["new"])
            print(
                f"round {r}: old {got['old']:,.0f} tok/s  new {got['new']:,.0f} tok/s  "
                f"ratio {ratios[-1]:.3f}; whole process CPU old {cpu['old']:.1f} s  new "
                f"{cpu['new']:.1f} s  ratio old/new {cpus[-1]:.3f}"
            )
    lo, hi = quartiles(ratios)
    print(
        f"median: old {statistics.median(olds):,.0f} tok/s, new {statistics.median(news):,.0f} "
        f"tok/s; ratio new/old {statistics.median(ratios):.3f} (quartiles {lo:.3f}-{hi:.3f}, "
        f"min-max {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} rounds); whole process "
        f"CPU old/new {statistics.median(cpus):.3f} (min-max {min(cpus):.3f}-{max(cpus):.3f})"
    )


if __name__ == "__main__":
    main()
