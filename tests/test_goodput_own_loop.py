"""Issue 24, item 1 for a user's loop: the record the public `Guard(run_dir=...)` writes is
accounted like `trainguard run`'s (goodput/loop_timing.py). A loop made of the public parts
crashes after its second checkpoint, its newest checkpoint is damaged, and it is started again:
the record holds each step once, the steps the resume redid, the restart, the checkpoint
stalls, the end, and the finding of the checkpoint the resume passed over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import trainguard
from trainguard.goodput.accounting import account_run
from trainguard.metrics.jsonl import read_metrics

STEPS, EVERY, CRASH = 12, 3, 8


class Crash(Exception):
    """The process dies mid-step: nothing after this point runs (no close, no end row)."""


def own_loop(out: Path, crash_at: int | None = None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    sampler = trainguard.ElasticSampler(96, global_batch_size=4, seed=0, world_size=1, rank=0)
    data = torch.randn(96, 4)
    guard = trainguard.Guard(run_dir=out)
    checkpointer = trainguard.Checkpointer(out / "checkpoints", keep=5)
    state = {"model": model, "optimizer": optimizer, "sampler": sampler, "guard": guard}
    guard.record.attach(sampler=sampler, checkpoints=checkpointer.root)
    step = checkpointer.load_latest(state) or 0
    guard.report(checkpointer.last_findings)  # a checkpoint passed over (C101) goes on record
    while step < STEPS:
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
        if step % EVERY == 0:
            with guard.phase("checkpoint", step):
                checkpointer.save(step, state)
    checkpointer.close()
    guard.close()


def _damage_newest(root: Path) -> int:
    newest = max(root.glob("step-*"), key=lambda p: p.name)
    tensors = newest / "state.safetensors"
    data = bytearray(tensors.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tensors.write_bytes(bytes(data))
    return int(newest.name.split("-")[1])


@pytest.fixture(scope="module")
def crashed_and_resumed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("own-loop")
    with pytest.raises(Crash):
        own_loop(out, crash_at=CRASH)
    assert _damage_newest(out / "checkpoints") == 6  # the resume falls back to 3
    own_loop(out)
    return out


def test_the_record_holds_each_step_once_after_a_crash(crashed_and_resumed: Path) -> None:
    steps = [r["step"] for r in read_metrics(crashed_and_resumed) if r.get("kind") == "step"]
    assert steps == list(range(STEPS))  # 3..7 ran twice; the first attempt's rows are cut


def test_the_restart_and_the_steps_it_redid_are_accounted(crashed_and_resumed: Path) -> None:
    g = account_run(crashed_and_resumed)
    assert g.attempts == 2 and g.recorded
    (restart,) = g.restarts
    assert restart.resumed_from == 3 and restart.lost_steps == CRASH - 3
    assert g.redone_steps == CRASH - 3 and g.steps == STEPS
    # Saves 3 and 6 before the crash, 6, 9 and 12 after; the first 6 is in the redone time.
    assert len(g.checkpoint_stalls) == 1 + 3
    assert g.seconds["startup"] > 0 and g.seconds["checkpoint"] > 0
    assert sum(g.seconds.values()) == pytest.approx(g.wall_s)


def test_the_resume_finding_is_kept_after_the_cut(crashed_and_resumed: Path) -> None:
    rows = read_metrics(crashed_and_resumed)
    attempts = [i for i, r in enumerate(rows) if r.get("what") == "attempt"]
    c101 = [i for i, r in enumerate(rows) if r.get("code") in ("C101", "C102")]
    assert len(attempts) == 2 and c101, [r.get("code") for r in rows if r.get("code")]
    assert rows[c101[0]]["step"] == 6 and attempts[1] < c101[0]  # the second process's start
    assert rows[-1]["what"] == "end" and rows[-1]["step"] == STEPS - 1
    run = json.loads((crashed_and_resumed / "run.json").read_text())
    assert run["schema_version"] == 2
