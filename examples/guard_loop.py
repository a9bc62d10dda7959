"""trainguard's Guard and hang Watchdog in a plain PyTorch loop.

    python examples/guard_loop.py [--run-dir /tmp/guard-demo]

A small regression model trains for 300 steps. Three faults are injected: a NaN batch
(step 100), a loss-spike batch (step 150) and a stretch of garbage batches (steps 220-224)
that makes the guard ask for a rollback. The loop follows the guard's protocol: `guard.judge`
BEFORE the update, so no bad update is ever applied; `guard.settle` reruns a refused step on
the same batch (the same result again: the data's fault, R206; a different one would point to
the hardware, R205); on a rollback the loop restores the last in-memory checkpoint and skips
the offending batches, keeping a record of them.
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
    reruns: list[tuple[int | None, str]] = []  # (step, R205 hardware / R206 data)
    step = 0

    def forward_backward(step: int) -> torch.Tensor:
        """Step `step`'s loss and gradients; `guard.settle` calls it again to rerun a step."""
        with watchdog.phase("data"):
            xb, yb = batch_for(step, x, y)
        with watchdog.phase("forward"):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
        with watchdog.phase("backward"):
            loss.backward()
        return loss.detach()

    def act(done) -> int | str | None:
        """What the loop does with a settled decision (on a GPU, the device path's decisions
        come a step late): the step to go back to, "halt", or None to go on."""
        d = done.decision
        reruns.extend((f.step, f.code) for f in done.findings if f.code in ("R205", "R206"))
        if d is None or d.action == "apply":
            return None
        actions[d.action].append(d.step)
        if d.action == "rollback":  # the in-memory checkpoint back, the bad batches skipped
            skip_batches.update(d.bad_steps)
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["opt"])
            guard.after_rollback(ckpt["guard"])
            opt.zero_grad(set_to_none=True)
            return ckpt["step"]
        return "halt" if d.action == "halt" else None

    while step < steps:
        if step in skip_batches:  # a batch a rollback told us to skip: recorded, not trained
            step += 1
            continue
        loss = forward_backward(step)
        judged = guard.judge(step, loss=loss, model=model, optimizer=opt)  # before the update
        # The rerun and the findings; rollback and halt are ours here (defer): act() does them.
        back = act(guard.settle(judged, rerun=forward_backward, defer=True))
        saving = (step + 1) % checkpoint_every == 0
        if back is None:
            with watchdog.phase("optimizer"):
                judged.optimizer_step(opt)  # applied, or skipped as judged
            opt.zero_grad(set_to_none=True)
            end = guard.after_update(step, model, opt, checkpoint_due=saving)  # read back
            back = act(guard.settle(end, rerun=forward_backward, defer=True))
        if back == "halt":
            break
        if back is not None:
            step = int(back)
            continue
        watchdog.heartbeat(step)
        step += 1
        if saving:
            with watchdog.phase("checkpoint"):
                ckpt = snapshot(step, model, opt, guard)
    watchdog.stop()
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(model(x), y).item()
    return {
        "actions": actions,
        "skipped_batches": sorted(skip_batches),
        "rollbacks": guard.rollbacks,
        "reruns": reruns,
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
