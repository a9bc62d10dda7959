"""trainguard.Checkpointer on CUDA: CUDA tensors and the CUDA generator in a non-sharded
checkpoint, and FSDP2 shards on CUDA through DCP under nccl. Skipped without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from ckpt_workers import run_ranks
from trainguard import Checkpointer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(autouse=True)
def cuda_rng_guard():
    if torch.cuda.is_available():
        state = torch.cuda.get_rng_state()
        yield
        torch.cuda.set_rng_state(state)
    else:
        yield


@pytest.mark.parametrize("async_save", [False, True])
def test_cuda_state_and_generator_round_trip(tmp_path: Path, async_save: bool) -> None:
    model = nn.Linear(32, 32).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 32, device="cuda")).sum().backward()
    opt.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    torch.cuda.manual_seed(11)
    ckpt = Checkpointer(tmp_path / "ckpt", async_save=async_save)
    out = ckpt.save(1, {"model": model, "optim": opt})
    draw = torch.rand(5, device="cuda")
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on while an async save writes
    if async_save:
        out.wait(timeout=60)
    ckpt.close()
    fresh = nn.Linear(32, 32).cuda()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    assert Checkpointer(tmp_path / "ckpt").load_latest({"model": fresh, "optim": fresh_opt}) == 1
    assert torch.equal(torch.rand(5, device="cuda"), draw)
    for k, v in fresh.state_dict().items():
        assert v.is_cuda and torch.equal(v, saved[k]), k
    assert fresh_opt.state_dict()["state"][0]["exp_avg"].is_cuda


def test_fsdp2_shards_on_cuda_under_nccl(tmp_path: Path) -> None:
    world = min(2, torch.cuda.device_count())  # nccl wants one GPU per rank
    results = run_ranks("cuda_fsdp", world, tmp_path, backend="nccl")
    for r in results:
        assert "error" not in r, r["error"]
        assert r["step"] == 2 and r["same"] and r["device"].startswith("cuda")
        assert r["draw_after_load"] == r["draw_after_save"]
