"""How long `trainguard run`'s loop stops for a checkpoint, at checkpoint intervals of a few
steps and more: the background write with one snapshot held (`checkpoint.queue: 1`, the
behaviour before the queue: every save waits for the previous write), with the default queue
(`checkpoint.queue: 2`), the same skipping a save that would wait (`checkpoint.when_full:
skip`), and optionally the write in the loop (`checkpoint.async_save: false`), side by side.

Every setting runs the same recipe in this process at each interval, the settings' order
rotating round after round. The stall of a checkpoint is the time the loop is stopped by it:
its time in `save_checkpoint` (the wait for room in the queue, the copy of the small state,
for a synchronous save the whole write) plus the next step's wait for the background copy of
the weights and the optimizer state before its update (`Checkpointer.wait_copied`). The last
checkpoint and the end's wait for every write are reported apart (the end waits by design).
The step time is each step's wall time less the stall inside it; the stall ratio is the median
stall per checkpoint over the median step time (a ratio of 0.1 at interval 1 costs 10% of the
run's time). The background work (the copy, the write) is not a stall: it shares the cores
with the loop's next steps. Prints each round, the medians of each setting at each interval,
the load average before and after, and the machine line.

    python benchmarks/bench_run_checkpoint_stall.py [--intervals 1,2,4,15] [--steps 30]
        [--rounds 3] [--modes queue1,queue2,skip] [--set model.d_model=256 ...]

`--modes queue1,sync` is the comparison of the earlier rows of docs/benchmarks.md (background
write vs write in the loop).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from machine import describe

import trainguard.train.saving as saving
import trainguard.train.spine as spine
from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.config import load_recipe
from trainguard.data.prepare import prepare_data
from trainguard.train.guarded_run import run_recipe

MODES = {
    "queue1": ["checkpoint.async_save=true", "checkpoint.queue=1"],  # the old behaviour
    "queue2": ["checkpoint.async_save=true", "checkpoint.queue=2"],  # the default
    "skip": ["checkpoint.async_save=true", "checkpoint.queue=2", "checkpoint.when_full=skip"],
    "sync": ["checkpoint.async_save=false"],
}


class Timings:
    """Per step: its wall time and the stall inside it; per checkpoint: its stall."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, float]] = []  # (wall, stall inside)
        self.saves: list[float] = []  # stall per checkpoint: its save + the next copy wait
        self.end = 0.0
        self.skipped = 0
        self._inside = 0.0

    def stall(self, seconds: float, save: bool) -> None:
        self._inside += seconds
        if save:
            self.saves.append(seconds)
        elif self.saves:  # the copy wait belongs to the checkpoint before it
            self.saves[-1] += seconds


def one_run(recipe: Any) -> Timings:
    t = Timings()
    real_save, real_finish, real_step = (
        saving.save_checkpoint,
        spine.finish_checkpoint,
        spine.train_step,
    )
    real_wait = Checkpointer.wait_copied

    def timed(fn: Callable[..., Any], after: Callable[[float], None]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                after(time.perf_counter() - t0)

        return wrapper

    def step_done(seconds: float) -> None:
        t.steps.append((seconds, t._inside))
        t._inside = 0.0

    def wait_copied(self: Checkpointer) -> None:
        if self._copied is None:  # no copy under way: no checkpoint before this step
            return real_wait(self)
        return timed(real_wait, lambda s: t.stall(s, save=False))(self)

    def end(seconds: float) -> None:
        t.end += seconds

    saving.save_checkpoint = timed(real_save, lambda s: t.stall(s, save=True))
    spine.finish_checkpoint = timed(real_finish, end)  # the spine calls it once, at the end
    spine.train_step = timed(real_step, step_done)
    Checkpointer.wait_copied = wait_copied  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            result = run_recipe(recipe, run_dir, progress=False, report=False, evals=False)
    finally:
        saving.save_checkpoint, spine.finish_checkpoint = real_save, real_finish
        spine.train_step = real_step
        Checkpointer.wait_copied = real_wait  # type: ignore[method-assign]
    t.skipped = sum(1 for f in result.findings if f.code == "C124")
    # The last save (at max_steps) is followed at once by the end's wait: reported apart.
    t.end += t.saves.pop()
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="default")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--intervals", "--interval", default="1,2,4,15")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="queue1,queue2,skip")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override, e.g. --set model.d_model=256 (repeatable)",
    )
    args = ap.parse_args()
    modes = args.modes.split(",")
    intervals = [int(i) for i in args.intervals.split(",")]
    print(describe())
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    base = [
        f"train.max_steps={args.steps}",
        f"train.eval_interval={args.steps}",
        "checkpoint.keep=2",
        "train.eval_batches=1",
        "preflight.enabled=false",
        *args.set,
    ]
    first = load_recipe(args.recipe, base)
    prepare_data(first.data, first.tokenizer, progress=False)
    runs: dict[tuple[int, str], list[Timings]] = {(i, m): [] for i in intervals for m in modes}
    for r in range(args.rounds):
        for interval in intervals:
            order = modes[r % len(modes) :] + modes[: r % len(modes)]
            for mode in order:
                over = [*base, f"checkpoint.interval={interval}", *MODES[mode]]
                t = one_run(load_recipe(args.recipe, over))
                runs[interval, mode].append(t)
                shown = ", ".join(f"{s * 1000:.1f}" for s in t.saves)
                print(
                    f"round {r} interval {interval} {mode}: stall per checkpoint [{shown}] ms; "
                    f"skipped {t.skipped}; end {t.end * 1000:.0f} ms",
                    flush=True,
                )
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(
        "interval | mode | checkpoints (skipped) | median stall per checkpoint ms (min-max) | "
        "median step ms | stall ratio | stall share of the loop"
    )
    for interval in intervals:
        for mode in modes:
            ts = runs[interval, mode]
            saves = [s for t in ts for s in t.saves]
            work = [w - inside for t in ts for w, inside in t.steps]
            wall = sum(w for t in ts for w, _ in t.steps)
            stall = statistics.median(saves) if saves else 0.0
            step = statistics.median(work)
            share = sum(saves) / wall if wall else 0.0
            spread = f"{min(saves) * 1000:.1f}-{max(saves) * 1000:.1f}" if saves else "-"
            print(
                f"{interval} | {mode} | {len(saves)} ({sum(t.skipped for t in ts)}) | "
                f"{stall * 1000:.1f} ({spread}) | {step * 1000:.0f} | {stall / step:.3f} | "
                f"{share:.3f}"
            )


if __name__ == "__main__":
    main()
