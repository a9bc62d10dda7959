"""The one guard protocol in a user's own loop: `judge` before the update, `settle` acts on what
is known (rerun, rollback, halt), `Judgement.optimizer_step` applies, skips or masks the update,
`after_update` after it. The same loop on the host path and on the device path (decided on the
CPU here with `decide_on="device"`) takes the same decisions, records the same rerun verdicts
(R205: a fault only the first computation saw, hardware; R206: the batch itself, data) and ends
with the same weights.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trainguard import Checkpointer, ElasticSampler, Guard, GuardsConfig
from trainguard.errors import RunHalted

N, G = 64, 4


@pytest.fixture(autouse=True)
def rng_and_threads():
    """A restore puts back the checkpoint's generator states: give this process its own back."""
    t, r, n = torch.get_rng_state(), random.getstate(), np.random.get_state()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_rng_state(t)
    random.setstate(r)
    np.random.set_state(n)
    torch.set_num_threads(threads)


def train(
    run_dir: Path,
    decide_on: str,
    *,
    transient: set[int] = frozenset(),
    bad_data: set[int] = frozenset(),
    poisoned: set[int] = frozenset(),
    steps: int = 12,
    every: int = 4,
    **config: Any,
) -> dict[str, Any]:
    """The protocol loop. `transient`: steps whose FIRST computation is corrupted (a NaN in
    the activations: hardware); `bad_data`: steps whose batch holds a NaN every time it is
    read; `poisoned`: samples that hold a NaN (a rollback skips them)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    x[sorted(poisoned)] = float("nan")
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    sampler = ElasticSampler(N, global_batch_size=G, seed=3, max_steps=steps)
    guard = Guard(run_dir=run_dir, config=GuardsConfig(decide_on=decide_on, **config))
    state = {"model": model, "optimizer": optimizer, "sampler": sampler, "guard": guard}
    checkpointer = Checkpointer(run_dir / "checkpoints")
    computed: Counter[int] = Counter()

    def forward_backward(s: int) -> torch.Tensor:
        """Step s's loss and gradients: the rerun calls this again for the same step."""
        computed[s] += 1
        ids = torch.as_tensor(sampler.batch_ids(s))
        xb = x[ids].clone()
        if s in bad_data or (s in transient and computed[s] == 1):
            xb[0, 0] = float("nan")
        loss = F.mse_loss(model(xb), y[ids])
        loss.backward()
        return loss.detach()

    def settled(what: Any) -> int | None:
        done = guard.settle(
            what, rerun=forward_backward, checkpointer=checkpointer, state=state, sampler=sampler
        )
        return done.rolled_back_to

    step = checkpointer.load_latest(state) or 0
    for _ in range(100):  # a bound
        if step == steps:
            break
        loss = forward_backward(step)
        j = guard.judge(step, loss=loss, model=model, optimizer=optimizer)
        back = settled(j)
        if back is None:
            j.optimizer_step(optimizer)
            optimizer.zero_grad(set_to_none=True)
            saving = (step + 1) % every == 0 or step + 1 == steps
            back = settled(guard.after_update(step, model, optimizer, checkpoint_due=saving))
        if back is not None:
            step = back
            continue
        step += 1
        if saving:
            checkpointer.save(step, state)
    assert guard.pending_step is None  # the last step was read back before its save
    guard.close()
    rows = [json.loads(line) for line in (run_dir / "guard.jsonl").open()]
    findings = [(r["step"], r["code"]) for r in rows if r["kind"] == "finding"]
    return {"model": model, "findings": findings, "computed": computed, "guard": guard}


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("decide_on", ["host", "device"])
def test_a_transient_fault_reruns_as_hardware_and_bad_data_as_data(
    tmp_path: Path, decide_on: str
) -> None:
    out = train(tmp_path, decide_on, transient={3}, bad_data={7})
    assert out["computed"][3] == 2 and out["computed"][7] == 2  # each rerun once
    assert (3, "R205") in out["findings"] and (3, "R206") not in out["findings"]
    assert (7, "R206") in out["findings"] and (7, "R205") not in out["findings"]
    assert (3, "R201") in out["findings"] and (7, "R201") in out["findings"]  # skipped


def test_host_and_device_paths_end_alike_with_reruns(tmp_path: Path) -> None:
    host = train(tmp_path / "host", "host", transient={3}, bad_data={7})
    device = train(tmp_path / "device", "device", transient={3}, bad_data={7})
    assert host["findings"] == device["findings"]
    for a, b in zip(weights(host["model"]), weights(device["model"]), strict=True):
        assert torch.equal(a, b)  # the rerun on the device path kept the next step's gradients


@pytest.mark.parametrize("decide_on", ["host", "device"])
def test_settle_rolls_back_through_the_checkpointer(tmp_path: Path, decide_on: str) -> None:
    sampler = ElasticSampler(N, global_batch_size=G, seed=3)
    poisoned = {int(i) for s in (5, 6) for i in sampler.batch_ids(s)[:1]}  # steps 5 and 6
    out = train(tmp_path, decide_on, poisoned=poisoned, repeat_count=2, rerun_on=[])
    assert (6, "R204") in out["findings"] and (6, "R202") in out["findings"]
    assert out["guard"].rollbacks == 1
    assert out["computed"][4] == 2  # rolled back to checkpoint 4, step 4 computed again
    assert all(torch.isfinite(p).all() for p in out["model"].parameters())


def test_settle_without_a_checkpoint_halts_with_the_one_text(tmp_path: Path) -> None:
    sampler = ElasticSampler(N, global_batch_size=G, seed=3)
    poisoned = {int(i) for s in (1, 2) for i in sampler.batch_ids(s)[:1]}
    with pytest.raises(RunHalted, match="no valid checkpoint to return to") as e:
        train(tmp_path, "host", poisoned=poisoned, repeat_count=2, rerun_on=[], every=100)
    assert "rollback at step 2" in e.value.message
