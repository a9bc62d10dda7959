"""trainguard's Guard and hang Watchdog in a plain PyTorch loop.

    python examples/guard_loop.py [--run-dir /tmp/guard-demo]

A small regression model trains for 300 steps. Three faults are injected: a NaN batch
(step 100), a loss-spike batch (step 150) and a stretch of garbage batches (steps 220-224)
that makes the guard ask for a rollback. The loop calls `guard.step` BEFORE `optimizer.step`,
so no bad update is ever applied; on a rollback it restores the last in-memory checkpoint
and skips the offending batches, keeping a record of them.
"""

from __future__ import annotations

import argparse
import copy
import math
import tempfile

import torch

from trainguard import Guard, GuardsConfig
from trainguard.guard.watchdog import Watchdog


def batch_for(step: int, x: torch.Tensor, y: torch.Tensor):
    idx = torch.arange(step * 32, step * 32 + 32) % len(x)
    xb, yb = x[idx].clone(), y[idx].clone()
    if step == 100:
        xb[0, 0] = math.nan  # a corrupt sample
    if step == 150 or 220 <= step <= 224:
        yb = yb * 50.0  # garbage targets: a loss spike
    return xb, yb


def snapshot(step: int, model, opt, guard: Guard) -> dict:
    """The last good checkpoint, kept in memory here; a real loop writes it to disk."""
    return {
        "step": step,
        "model": copy.deepcopy(model.state_dict()),
        "opt": copy.deepcopy(opt.state_dict()),
        "guard": guard.state_dict(),  # the monitors' windows travel with the checkpoint
    }


def main(run_dir: str, steps: int = 300, checkpoint_every: int = 50) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # a tiny model: threads only add overhead
    x = torch.randn(8192, 16)
    y = x @ torch.randn(16, 1) + 0.1 * torch.randn(8192, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    guard = Guard(run_dir=run_dir, config=GuardsConfig(max_rollbacks=2))
    watchdog = Watchdog(run_dir, floor_s=60.0).start()

    ckpt = snapshot(0, model, opt, guard)
    skip_batches: set[int] = set()
    actions: dict[str, list[int]] = {"skip": [], "rollback": [], "halt": []}
    step = 0
    while step < steps:
        if step in skip_batches:  # a batch a rollback told us to skip: recorded, not trained
            step += 1
            continue
        with watchdog.phase("data"):
            xb, yb = batch_for(step, x, y)
        with watchdog.phase("forward"):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
        with watchdog.phase("backward"):
            loss.backward()
        decision = guard.step(step, loss=loss, model=model, optimizer=opt)
        if decision.action == "apply":
            with watchdog.phase("optimizer"):
                opt.step()
        elif decision.action == "rollback":
            actions["rollback"].append(step)
            skip_batches.update(decision.bad_steps)
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["opt"])
            guard.after_rollback(ckpt["guard"])
            step = ckpt["step"]
            opt.zero_grad(set_to_none=True)
            continue
        elif decision.action == "halt":
            actions["halt"].append(step)
            break
        else:
            actions["skip"].append(step)
        opt.zero_grad(set_to_none=True)
        watchdog.heartbeat(step)
        step += 1
        if step % checkpoint_every == 0:
            with watchdog.phase("checkpoint"):
                ckpt = snapshot(step, model, opt, guard)
    watchdog.stop()
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(model(x), y).item()
    return {
        "actions": actions,
        "skipped_batches": sorted(skip_batches),
        "rollbacks": guard.rollbacks,
        "final_loss": final,
        "finite": all(torch.isfinite(p).all().item() for p in model.parameters()),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", default=None)
    args = ap.parse_args()
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="guard-demo-")
    summary = main(run_dir)
    print(f"run dir: {run_dir} (findings in guard.jsonl)")
    for k, v in summary.items():
        print(f"{k}: {v}")
