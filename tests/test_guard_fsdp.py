"""The guard protocol on FSDP2-sharded gradients (two forked gloo processes, `fully_shard` on a
1-D CPU mesh), and which Hugging Face Trainer parallelisms `GuardedTrainer` accepts.

A sharded model is judged on the host with the WHOLE model's pre-clip gradient norm (the
gradients are DTensor shards: a per-rank norm would be one shard's), the same on every rank. A
NaN in rank 1's batch at step 3 is skipped by both ranks and, rerun on the same batches, fails
again (R206, data); a fault only rank 0's first computation of step 5 saw passes on the rerun
(R205, hardware), on both ranks alike.

accelerate enables FSDP only on GPUs (on CPU the Trainer silently runs DDP), so the Trainer's
own FSDP2 path cannot run on this machine; what it refuses is checked on `hf_parallel.refusal`.
"""

from __future__ import annotations

import json
import math
import multiprocessing
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainguard import Guard
from trainguard.config.distributed import DistributedConfig
from trainguard.errors import ConfigError

CTX = multiprocessing.get_context("fork")
STEPS, NAN_STEP, FLAKY_STEP = 8, 3, 5


def _worker(rank: int, world: int, tmp: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=rank,
                            world_size=world)  # fmt: skip
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = DistributedConfig(replica_check_interval=0, straggler_interval=0)
    guard = Guard(run_dir=tmp / f"rank{rank}", distributed=config)
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own half of the batch
    data = [(torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)) for _ in range(STEPS)]
    computed: Counter[int] = Counter()

    def forward_backward(s: int) -> torch.Tensor:
        computed[s] += 1
        x, y = data[s][0].clone(), data[s][1]
        bad_data = s == NAN_STEP and rank == 1
        if bad_data or (s == FLAKY_STEP and rank == 0 and computed[s] == 1):
            x[0, 0] = math.nan
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss.detach()

    rows = []
    for step in range(STEPS):
        loss = forward_backward(step)
        # The whole model's norm, from the full gradients (a collective on every rank).
        full = sum(float(p.grad.full_tensor().double().square().sum()) for p in model.parameters())
        judged = guard.judge(step, loss=loss, model=model, optimizer=optimizer)
        done = guard.settle(judged, rerun=forward_backward)
        judged.optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        guard.settle(guard.after_update(step, model, optimizer))
        d, codes = judged.decision, [f.code for f in done.findings]
        rows.append({"step": step, "action": d.action, "judged_norm": d.values["grad_norm"],
                     "full_norm": math.sqrt(full), "codes": codes})  # fmt: skip
    weights = [p.full_tensor().flatten().tolist() for p in model.parameters()]
    (tmp / f"rank{rank}.json").write_text(json.dumps({"rows": rows, "weights": weights}))
    guard.close()
    dist.destroy_process_group()


def test_fsdp2_judged_on_the_full_norm_with_reruns_on_every_rank(tmp_path: Path) -> None:
    procs = [CTX.Process(target=_worker, args=(r, 2, tmp_path)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    for a, b in zip(r0["rows"], r1["rows"], strict=True):  # every rank judged alike
        assert (a["action"], a["codes"]) == (b["action"], b["codes"])
        assert str(a["judged_norm"]) == str(b["judged_norm"])  # NaN-safe
    for row in r0["rows"]:
        if math.isfinite(row["full_norm"]):  # the whole model's norm, not a shard's
            assert row["judged_norm"] == pytest.approx(row["full_norm"], rel=1e-5), row
    actions = {row["step"]: row["action"] for row in r0["rows"]}
    assert [s for s, a in actions.items() if a != "apply"] == [NAN_STEP, FLAKY_STEP]
    for rows in (r0["rows"], r1["rows"]):
        assert "R206" in rows[NAN_STEP]["codes"] and "R205" not in rows[NAN_STEP]["codes"]
        assert "R205" in rows[FLAKY_STEP]["codes"] and "R206" not in rows[FLAKY_STEP]["codes"]
    assert r0["weights"] == r1["weights"]
    assert all(math.isfinite(w) for ws in r0["weights"] for w in ws)


# -- GuardedTrainer: what is refused at start ------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "extra", "refused"),
    [
        ("NO", {}, None),
        ("MULTI_CPU", {}, None),
        ("MULTI_GPU", {}, None),
        ("FSDP", {"fsdp_version": 2}, None),
        ("DEEPSPEED", {}, "DeepSpeed"),
        ("MULTI_GPU", {"deepspeed": True}, "DeepSpeed"),
        ("FSDP", {"fsdp_version": 1}, "FSDP version 1"),
        ("XLA", {}, "XLA"),
        ("MEGATRON_LM", {}, "MEGATRON_LM"),
        ("MULTI_GPU", {"sharded_by_transformers": True}, "sharded by transformers"),
    ],
)
def test_trainer_parallelisms_guarded_or_refused(kind: str, extra: dict, refused: str | None):
    pytest.importorskip("transformers")
    from trainguard.integrations.hf_parallel import refusal

    why = refusal(kind, **extra)
    assert (why is None) if refused is None else (refused in why)


def test_a_refused_trainer_is_a_config_error_naming_what_is_supported(tmp_path: Path) -> None:
    """The real Trainer, built; its accelerator state as DeepSpeed's: the check raises before
    any step, saying what is supported (ConfigError: exit 2 under the CLI)."""
    transformers = pytest.importorskip("transformers")
    from trainguard.integrations.hf_parallel import check_parallelism

    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                          max_steps=1)  # fmt: skip
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8)
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args)
    check_parallelism(trainer)  # one CPU process: guarded
    trainer.is_deepspeed_enabled = True
    with pytest.raises(ConfigError, match="DeepSpeed") as e:
        check_parallelism(trainer)
    assert "FSDP2" in e.value.fix and "DDP" in e.value.fix
