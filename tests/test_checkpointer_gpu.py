"""trainguard.Checkpointer on CUDA: CUDA tensors and the CUDA generator in a non-sharded
checkpoint, run's background copy of CUDA state, and FSDP2 shards on CUDA through DCP under
nccl. Skipped without a GPU."""

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


def test_background_copy_of_cuda_state_writes_the_in_loop_bytes(tmp_path: Path) -> None:
    """`trainguard run`'s background copy on CUDA: the writer thread copies the weights and
    the optimizer state while the loop goes on; after `wait_copied` the loop's next update
    must not reach the files, which are byte for byte an in-loop save's (the copy and the
    update are ordered on the device)."""
    from loophelpers import run_state
    from trainguard import ElasticSampler

    device = "cuda"
    torch.manual_seed(0)
    model = nn.Linear(32, 32).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step() -> None:
        opt.zero_grad()
        model(torch.randn(4, 32, device=device)).sum().backward()
        opt.step()

    step()
    state = run_state(model, opt, ElasticSampler(100, global_batch_size=2, seed=0))
    background = Checkpointer(tmp_path / "async", async_save=True, background_copy=True)
    in_loop = Checkpointer(tmp_path / "sync")
    try:
        for s in (1, 2):  # 1 allocates the copies, 2 refills them
            in_loop.save(s, state)
            handle = background.save(s, state)
            background.wait_copied()
            step()  # the update the loop makes right after
            handle.wait(timeout=60)
    finally:
        background.close()
    for s in (1, 2):
        for name in ("state.json", "state.safetensors"):
            a, b = ((tmp_path / k / f"step-{s}" / name).read_bytes() for k in ("async", "sync"))
            assert a == b, f"step {s}: {name}"
