"""Multi-process Checkpointer scenarios: real torch.distributed processes (gloo on CPU, a file
rendezvous in the test's tmp_path, so no ports), a tiny FSDP2 model, real DCP.

`run_ranks(scenario, world, tmp)` starts `world` spawned processes, each runs
`SCENARIOS[scenario](rank, world, tmp, **kwargs)` and writes what it returns (JSON) to
`tmp/<scenario>-rank<r>.json`; a process that raises writes its traceback instead.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

# -- the model every scenario trains ---------------------------------------------------------


def tiny_model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def fsdp(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step))
    x = x.to(next(model.parameters()).device)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()


def full_hashes(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, str]:
    """sha256 of every full (unsharded) weight and optimizer tensor, by name; collective for
    FSDP2 modules. Empty on ranks other than 0 (DCP gathers to rank 0)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    out = {}
    for name, t in get_model_state_dict(model, options=opts).items():
        out[f"model.{name}"] = _sha(t)
    osd = get_optimizer_state_dict(model, opt, options=opts)
    for fqn, entry in osd.get("state", {}).items():
        for k, t in entry.items():
            out[f"optim.{fqn}.{k}"] = _sha(t)
    return out


def _sha(t: torch.Tensor) -> str:
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


# -- the harness -----------------------------------------------------------------------------


def run_ranks(
    scenario: str,
    world: int,
    tmp: Path,
    timeout: float = 180,
    backend: str = "gloo",
    **kwargs: Any,
) -> list[dict]:
    """Run `scenario` on `world` processes; each rank's result (or {"error": traceback})."""
    ctx = mp.get_context("spawn")
    init = tmp / f"rendezvous-{uuid.uuid4().hex}"
    procs = [
        ctx.Process(target=_main, args=(scenario, r, world, str(init), str(tmp), backend, kwargs))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join()
    assert not alive, f"{scenario}: {len(alive)} rank(s) still running after {timeout} s"
    results = []
    for r, p in enumerate(procs):
        out = tmp / f"{scenario}-rank{r}.json"
        res = json.loads(out.read_text()) if out.exists() else {"error": f"exit {p.exitcode}"}
        res["exitcode"] = p.exitcode
        results.append(res)
    return results


def _main(
    scenario: str, rank: int, world: int, init: str, tmp: str, backend: str, kwargs: dict
) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    torch.set_num_threads(1)
    out = Path(tmp) / f"{scenario}-rank{rank}.json"
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"file://{init}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=60),
        )
        result = SCENARIOS[scenario](rank, world, Path(tmp), **kwargs)
    except BaseException:
        result = {"error": traceback.format_exc()}
        print(result["error"], file=sys.stderr)
    out.write_text(json.dumps(result))
    os._exit(0)  # no teardown: a scenario may have lost a peer on purpose


# -- scenarios -------------------------------------------------------------------------------


def _error(fn: Callable[[], Any]) -> str | None:
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def local_faults(rank: int, world: int, tmp: Path) -> dict:
    """Non-sharded per-rank RNG round trip, then async sharded saves: two good ones, one with a
    full disk on rank 1, one where rank 1 dies after writing its shards."""
    import resource

    from trainguard import Checkpointer

    out: dict[str, Any] = {}
    # Replicated (DDP-style) state, non-sharded: rank 0 writes, every rank's RNG is saved.
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_step(model, opt, 0)
    plain = Checkpointer(tmp / "plain")
    torch.manual_seed(1000 + rank)
    plain.save(1, {"model": model, "optim": opt})
    out["draw_after_save"] = torch.rand(4).tolist()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert plain.load_latest({"model": model, "optim": opt}) == 1
    out["draw_after_load"] = torch.rand(4).tolist()
    out["plain_weight"] = _sha(model[0].weight)

    # FSDP2, sharded through DCP.
    model = fsdp(tiny_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    die = {"at": None}

    def on_phase(phase: str, step: int) -> None:
        if phase == "shards_written" and rank == 1 and step == die["at"]:
            (tmp / f"local_faults-rank{rank}.json").write_text(json.dumps(out))
            os.kill(os.getpid(), signal.SIGKILL)  # a rank lost mid-save, no cleanup

    # Async: each save captures the shards before returning and writes them in the background
    # while training goes on; its errors arrive through wait().
    ckpt = Checkpointer(tmp / "sharded", keep=3, async_save=True, on_phase=on_phase)
    state = {"model": model, "optim": opt, "progress": {"epoch": 1}}
    out["hashes"] = {}
    for step in (1, 2):
        train_step(model, opt, step)
        out["hashes"][step] = full_hashes(model, opt)
        handle = ckpt.save(step, state)
        state["progress"] = {"epoch": 1 + step}  # changed right away: the save must not see it
        train_step(model, opt, 10 + step)
        out["path"] = handle.wait(timeout=120)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if rank == 1:  # a real kernel limit: rank 1's writes past 1 kB fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
    try:
        out["full_disk_error"] = _error(lambda: ckpt.save(3, state).wait(timeout=120))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    die["at"] = 4
    out["dead_rank_error"] = _error(lambda: ckpt.save(4, state).wait(timeout=120))
    return out


def s3_sharded(rank: int, world: int, tmp: Path, endpoint: str) -> dict:
    """Sharded save to S3 through a store that throttles some uploads, then a load by both
    ranks through one node cache."""
    from s3_server import storage_options
    from trainguard import Checkpointer
    from trainguard.checkpoint import RetryPolicy

    retry = RetryPolicy(
        attempts=8, base_delay_s=0.002, max_delay_s=0.02, stagger_s=0.01, verify_checksums=False
    )
    opts = dict(storage_options=storage_options(endpoint), retry=retry)
    model = fsdp(tiny_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_step(model, opt, 1)
    saver = Checkpointer("s3://ckpt/run", cache_dir=tmp / f"save-cache-{rank}", **opts)
    path = saver.save(1, {"model": model, "optim": opt})
    saved = full_hashes(model, opt)
    findings = [f.to_dict() for f in saver.last_findings]
    dist.barrier()
    model2 = fsdp(tiny_model())
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    # Both ranks share one machine, so one node cache.
    loader = Checkpointer("s3://ckpt/run", cache_dir=tmp / "node-cache", **opts)
    step = loader.load_latest({"model": model2, "optim": opt2})
    return {
        "path": path,
        "step": step,
        "findings": findings,
        "same": full_hashes(model2, opt2) == saved,
    }


def reshard_load(rank: int, world: int, tmp: Path, root: str) -> dict:
    """Load a sharded checkpoint (saved by another world size) into an FSDP2 model."""
    import random

    from trainguard import Checkpointer

    model = fsdp(tiny_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ckpt = Checkpointer(root)
    step = ckpt.load_latest({"model": model, "optim": opt, "progress": {}})
    return {
        "step": step,
        "hashes": full_hashes(model, opt),
        "codes": [f.code for f in ckpt.last_findings],
        "draw": [torch.rand(2).tolist(), random.random()],
    }


def cuda_fsdp(rank: int, world: int, tmp: Path) -> dict:
    """FSDP2 on CUDA under nccl: DCP writes CUDA shards (sync, then async while training goes
    on) and loads them back; each rank's CUDA generator is restored."""
    from trainguard import Checkpointer

    model = fsdp(tiny_model().cuda())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = {"model": model, "optim": opt}
    train_step(model, opt, 1)
    Checkpointer(tmp / "cuda").save(1, state)
    train_step(model, opt, 2)
    saved = full_hashes(model, opt)
    torch.cuda.manual_seed(7 + rank)
    ckpt = Checkpointer(tmp / "cuda", async_save=True)
    handle = ckpt.save(2, state)
    draw = torch.rand(3, device="cuda").tolist()
    train_step(model, opt, 3)  # changes the weights while the save may still be writing
    path = handle.wait(timeout=120)
    model2 = fsdp(tiny_model().cuda())
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    step = ckpt.load_latest({"model": model2, "optim": opt2})
    return {
        "path": path,
        "step": step,
        "same": full_hashes(model2, opt2) == saved,
        "draw_after_save": draw,
        "draw_after_load": torch.rand(3, device="cuda").tolist(),
        "device": str(next(model2.parameters()).device),
    }


SCENARIOS: dict[str, Callable[..., dict]] = {
    "cuda_fsdp": cuda_fsdp,
    "local_faults": local_faults,
    "s3_sharded": s3_sharded,
    "reshard_load": reshard_load,
}
