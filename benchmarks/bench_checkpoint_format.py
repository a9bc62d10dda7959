"""The cost of one `trainguard run` checkpoint in the one format (the public Checkpointer's
FlatLayout) against the run's own layout of an earlier commit, side by side.

Each round saves the run's state (the default recipe's model and Muon optimizer, the sampler,
counters, guard and callbacks) 12 times in a fresh process per checkout, synchronously and with
`async_save` + `background_copy` (the run's default), alternating which checkout goes first.
A save is timed from `save` to the written, verified step (async: `wait_copied` then `wait`),
wall and the process's CPU; the first two saves (allocating the copy buffers) are left out.

    python benchmarks/bench_checkpoint_format.py [--old-rev 912c6b4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run_rebuild import old_source  # noqa: E402
from machine import describe  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"

CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
import torch
from trainguard import ElasticSampler, Guard
from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.config.load import validate_recipe
from trainguard.model.gpt import GPT
from trainguard.train.callback import Callbacks
from trainguard.train.optim import build_optimizer

r = validate_recipe({"model": {"n_layers": 4, "d_model": 128, "n_heads": 4},
                     "data": {"seq_len": 128}, "train": {"optimizer": "muon"}})
torch.manual_seed(0)
torch.set_num_threads(1)
model = GPT(r.model, vocab_size=4096, seq_len=128)
opt = build_optimizer(r, model)
model(torch.randint(0, 4096, (2, 128))).float().pow(2).mean().backward()
opt.step()
sampler = ElasticSampler(10000, global_batch_size=16, seed=0)
try:  # the earlier commit: the run's own layout
    from trainguard.train.layout import Progress, RunLayout
    prog = Progress()
    state = {"model": model, "optimizer": opt, "sampler": sampler, "progress": prog,
             "guard": Guard(), "callbacks": Callbacks([])}
    extra = lambda: {"layout": RunLayout({"name": "bench"}, {})}
except ImportError:  # the one format
    from trainguard.train.run_state import RunState
    prog = RunState()
    state = {"model": model, "optimizer": opt, "sampler": sampler, "run": prog,
             "guard": Guard(), "callbacks": Callbacks([])}
    extra = lambda: {}
tmp = Path(tempfile.mkdtemp())
out = {}
for mode in ("sync", "async"):
    kw = {"async_save": True, "background_copy": True} if mode == "async" else {}
    c = Checkpointer(tmp / mode, keep=2, **kw, **extra())
    wall, cpu = [], []
    for s in range(1, 13):
        prog.step = s
        c0, t0 = time.process_time(), time.perf_counter()
        h = c.save(s, state)
        if mode == "async":
            c.wait_copied()
            h.wait()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    c.close()
    out[mode] = {"wall": wall[2:], "cpu": cpu[2:]}
print(json.dumps(out))
"""


def measure(src: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(res.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-rev", default="912c6b4")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(describe())
    got: dict[str, dict[str, dict[str, list[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        old = old_source(args.old_rev, Path(tmp)) / "src"
        for r in range(args.rounds):
            order = [("old", old), ("new", SRC)] if r % 2 == 0 else [("new", SRC), ("old", old)]
            for name, src in order:
                for mode, figures in measure(src).items():
                    into = got.setdefault(name, {}).setdefault(mode, {"wall": [], "cpu": []})
                    into["wall"] += figures["wall"]
                    into["cpu"] += figures["cpu"]
            print(f"round {r} done")
    for mode in ("sync", "async"):
        med = {
            (name, kind): statistics.median(got[name][mode][kind]) * 1000
            for name in ("old", "new")
            for kind in ("wall", "cpu")
        }
        print(
            f"{mode}: old {med['old', 'wall']:.1f} ms wall / {med['old', 'cpu']:.1f} ms CPU, "
            f"new {med['new', 'wall']:.1f} ms / {med['new', 'cpu']:.1f} ms per save; new/old "
            f"wall {med['new', 'wall'] / med['old', 'wall']:.3f}, "
            f"CPU {med['new', 'cpu'] / med['old', 'cpu']:.3f} "
            f"({len(got['new'][mode]['wall'])} saves each, {args.old_rev} vs this tree)"
        )


if __name__ == "__main__":
    main()
