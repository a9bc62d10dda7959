"""A training loop made of trainguard's public parts as a user writes one: `Guard(run_dir=...)`
(the run record), `Checkpointer` (resumed with `load_latest`, what it passed over put on
record), `ElasticSampler`; for the tests of what any loop's record and checkpoints give the
tools (goodput accounting, the chaos soak of a command)."""

from __future__ import annotations

from pathlib import Path

import torch

import trainguard


class Crash(Exception):
    """The process dies mid-step: nothing after this point runs (no close, no end row)."""


def public_loop(
    out: Path,
    steps: int = 12,
    every: int = 3,
    *,
    crash_at: int | None = None,
    checkpoints: str = "checkpoints",
    keep: int = 5,
) -> None:
    """Train a linear model `steps` steps (resuming from OUT/CHECKPOINTS), saving every `every`
    completed steps; raise Crash as step `crash_at` begins."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    sampler = trainguard.ElasticSampler(96, global_batch_size=4, seed=0, world_size=1, rank=0)
    guard = trainguard.Guard(run_dir=out)
    checkpointer = trainguard.Checkpointer(out / checkpoints, keep=keep)
    state = {"model": model, "optimizer": optimizer, "sampler": sampler, "guard": guard}
    guard.record.attach(sampler=sampler, checkpoints=checkpointer.root)
    step = checkpointer.load_latest(state) or 0
    guard.report(checkpointer.last_findings)  # a checkpoint passed over (C101) goes on record
    data = torch.randn(96, 4, generator=torch.Generator().manual_seed(1))
    while step < steps:
        if step == crash_at:
            raise Crash
        with guard.phase("data", step):
            x = data[sampler.batch_ids(step)]
        loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
        loss.backward()
        judged = guard.judge(step, loss=loss.detach(), model=model, optimizer=optimizer)
        guard.settle(judged)
        judged.optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        guard.settle(guard.after_update(step, model, optimizer))
        step += 1
        if step % every == 0:
            with guard.phase("checkpoint", step):
                checkpointer.save(step, state)
    checkpointer.close()
    guard.close()
