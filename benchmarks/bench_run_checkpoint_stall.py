"""How long `trainguard run`'s loop stops for a checkpoint: written in the background
(`checkpoint.async_save: true`, the default) vs in the loop (`false`), side by side.

The same recipe runs in this process with each setting, alternating which goes first, round
after round. The stall of a checkpoint is the time the loop is stopped by it: its time in
`save_checkpoint` (the wait for the previous write if still running, the copy of the small
state, and for a synchronous save the whole write: payload, fsync, manifest, verification,
retention) plus, asynchronously, the next step's wait for the background copy of the weights
and the optimizer state before its update (`Checkpointer.wait_copied`). The final
checkpoint's wait at the end of the loop is reported apart (the end waits for the last write by
design). The background work (the copy, the write) is not a stall: it shares the cores with
the loop's next steps. Prints each round, the median stall per checkpoint of each setting,
their ratio (the target is <= 0.1) and the machine line.

    python benchmarks/bench_run_checkpoint_stall.py [--steps 16] [--interval 4] [--rounds 3]
        [--set model.d_model=256 ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from machine import describe

import trainguard.train.spine as spine
from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.config import load_recipe
from trainguard.data.prepare import prepare_data
from trainguard.train.run import run_recipe


def timed(calls: list[float], fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            calls.append(time.perf_counter() - t0)

    return wrapper


def one_run(recipe: Any) -> tuple[list[float], float]:
    """The stall of every checkpoint saved inside the loop, and the end's wait for the last."""
    saves: list[float] = []
    ends: list[float] = []
    copies: list[float] = []  # the next step's wait for a background copy, one per checkpoint
    real_save, real_finish = spine.save_checkpoint, spine.finish_checkpoint
    real_wait = Checkpointer.wait_copied

    def wait_copied(self: Checkpointer) -> None:
        if self._copied is None:  # no copy under way: a step without a checkpoint before it
            return real_wait(self)
        return timed(copies, real_wait)(self)

    spine.save_checkpoint = timed(saves, real_save)
    spine.finish_checkpoint = timed(ends, real_finish)  # the spine calls it once, at the end
    Checkpointer.wait_copied = wait_copied  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            run_recipe(recipe, run_dir, progress=False, report=False, evals=False)
    finally:
        spine.save_checkpoint, spine.finish_checkpoint = real_save, real_finish
        Checkpointer.wait_copied = real_wait  # type: ignore[method-assign]
    # The last save (at max_steps) is followed at once by the end's wait: count both as its stall
    # apart; the others are the loop's stall per checkpoint, with the next step's wait for the
    # copy when the copy is made in the background.
    in_loop = [s + (copies[i] if i < len(copies) else 0.0) for i, s in enumerate(saves[:-1])]
    return in_loop, saves[-1] + sum(ends)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="default")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--interval", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override, e.g. --set model.d_model=256 (repeatable)",
    )
    args = ap.parse_args()
    print(describe())
    overrides = [
        f"train.max_steps={args.steps}",
        f"train.eval_interval={args.steps}",
        f"checkpoint.interval={args.interval}",
        "checkpoint.keep=2",
        "train.eval_batches=1",
        "preflight.enabled=false",
        *args.set,
    ]
    recipes = {
        mode: load_recipe(args.recipe, [*overrides, f"checkpoint.async_save={mode == 'async'}"])
        for mode in ("async", "sync")
    }
    prepare_data(recipes["sync"].data, recipes["sync"].tokenizer, progress=False)
    stalls: dict[str, list[float]] = {"async": [], "sync": []}
    ends: dict[str, list[float]] = {"async": [], "sync": []}
    for r in range(args.rounds):
        order = ("async", "sync") if r % 2 == 0 else ("sync", "async")
        for mode in order:
            in_loop, end = one_run(recipes[mode])
            stalls[mode] += in_loop
            ends[mode].append(end)
            shown = ", ".join(f"{s * 1000:.1f}" for s in in_loop)
            print(f"round {r} {mode}: stall per checkpoint [{shown}] ms; end {end * 1000:.0f} ms")
    a, s = statistics.median(stalls["async"]), statistics.median(stalls["sync"])
    print(
        f"median stall per checkpoint: async {a * 1000:.1f} ms, sync {s * 1000:.1f} ms, "
        f"ratio {a / s:.3f} ({len(stalls['async'])} and {len(stalls['sync'])} checkpoints; "
        f"async min-max {min(stalls['async']) * 1000:.1f}-{max(stalls['async']) * 1000:.1f} ms, "
        f"sync {min(stalls['sync']) * 1000:.1f}-{max(stalls['sync']) * 1000:.1f} ms)"
    )
    print(
        f"end of run (last save + wait): async {statistics.median(ends['async']) * 1000:.0f} ms, "
        f"sync {statistics.median(ends['sync']) * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
