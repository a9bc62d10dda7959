"""trainguard.Checkpointer costs, each side by side with its baseline in the same run.

1. Sharded save of a 2-process FSDP2 model (gloo) through `Checkpointer.save` (DCP shards,
   per-rank checksums gathered to rank 0, manifest, fsync, rename, retention) vs a plain
   `dcp.save` of the same Stateful state to a fresh folder; and `Checkpointer.load_latest`
   (manifest, size and xxh3 of every file, the restricted metadata unpickler) vs `dcp.load`.
   Interleaved rounds, the order alternating; medians; ratio = Checkpointer / DCP.
2. `async_save=True`: how long `save` blocks the caller (the CPU copy of the shards) vs a
   synchronous `save`, same processes, same state.
3. 8 ranks (processes) save their shards to one S3 endpoint (moto on 127.0.0.1 behind a
   throttle that answers 503 SlowDown while more than `--capacity` requests are in flight,
   each held `--hold-ms`): without stagger and rate limit, then with them. The server counts
   the peak number of requests in flight and the 503s it sent (each one retry of ours).

    .venv/bin/python benchmarks/bench_checkpointer.py \\
        --mb 128 --rounds 9 --storm-mb 16 --hold-ms 200

The CPU model and flags are printed with the results (from /proc/cpuinfo).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from machine import describe  # noqa: E402
from torch import nn  # noqa: E402


def model_of(mb: int) -> nn.Module:
    """Linear layers holding `mb` MiB of fp32 weights (AdamW adds twice that in moments)."""
    torch.manual_seed(0)
    width = 1024
    layers = max(1, (mb << 20) // (4 * width * width))
    return nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])


def fsdp_model(mb: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    model = model_of(mb)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 1024)).sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def timed(fn: Any) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


# -- 1 and 2: sharded save/load vs DCP, async stall (2 ranks) -------------------------------


def settle() -> None:
    """Start every timed operation from the same disk state: flush what earlier rounds left
    dirty (otherwise the next fsync pays for it) and line the ranks up."""
    dist.barrier()
    if dist.get_rank() == 0:
        os.sync()
    dist.barrier()


def sharded_vs_dcp(rank: int, world: int, base: Path, mb: int, rounds: int) -> dict:
    import torch.distributed.checkpoint as dcp

    from trainguard import Checkpointer
    from trainguard.checkpoint.dcp_safe import ModelState, OptimizerState

    model, opt = fsdp_model(mb)
    state = {"model": model, "optim": opt}
    dcp_state = {"model": ModelState(model), "optim": OptimizerState(model, opt)}
    # keep > rounds: retention (a background delete after each save) never overlaps a timing.
    ckpt = Checkpointer(base / "ckpt", keep=rounds + 1)
    out: dict[str, list[float]] = {k: [] for k in ("tg", "dcp", "tg_load", "dcp_load")}
    for i in range(rounds):
        plain_dir = base / f"dcp-{i}"

        def ours(i: int = i) -> None:
            ckpt.save(i, state)

        def theirs(d: Path = plain_dir) -> None:
            dcp.save(dcp_state, storage_writer=dcp.FileSystemWriter(str(d), sync_files=True))

        jobs = [("tg", ours), ("dcp", theirs)]
        for name, job in jobs if i % 2 == 0 else jobs[::-1]:
            settle()
            out[name].append(timed(job))
        loads = [
            ("tg_load", lambda: ckpt.load_latest(state)),
            ("dcp_load", lambda d=plain_dir: dcp.load(dcp_state, checkpoint_id=str(d))),
        ]
        for name, job in loads if i % 2 == 0 else loads[::-1]:
            settle()
            out[name].append(timed(job))
        if rank == 0:
            shutil.rmtree(plain_dir)  # disk space; untimed
    # Async vs sync: the time `save` blocks the caller (the write goes on in the background).
    sync_ckpt = Checkpointer(base / "sync", keep=2)
    async_ckpt = Checkpointer(base / "async", keep=2, async_save=True)
    out["stall"], out["sync"] = [], []
    for i in range(rounds):
        settle()
        handle = async_ckpt.save(i, state)
        out["stall"].append(handle.stall_s)
        handle.wait()
        settle()
        out["sync"].append(timed(lambda i=i: sync_ckpt.save(i, state)))
    async_ckpt.close()
    return out


def sharded_entry(
    rank: int, world: int, init: str, base: str, mb: int, rounds: int, q: Any
) -> None:
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=600),
    )
    out = sharded_vs_dcp(rank, world, Path(base), mb, rounds)
    if rank == 0:
        q.put(out)
    dist.barrier()
    dist.destroy_process_group()


# -- 3: 8 ranks against a throttling S3 endpoint ----------------------------------------------


def storm_entry(
    rank: int,
    world: int,
    init: str,
    endpoint: str,
    mb: int,
    calm: bool,
    args_rate: float,
    base: str,
    q: Any,
) -> None:
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=600),
    )
    from s3_server import storage_options
    from trainguard import Checkpointer
    from trainguard.checkpoint import RetryPolicy

    model, opt = fsdp_model(mb)
    # Calm: the RetryPolicy default stagger (0.5 s per rank). Rush: everyone at once.
    retry = RetryPolicy(attempts=12, stagger_s=0.5 if calm else 0.0)
    ckpt = Checkpointer(
        f"s3://bench/storm-{'calm' if calm else 'rush'}",
        storage_options=storage_options(endpoint),
        retry=retry,
        rate_limit_mb_s=args_rate if calm else None,
        cache_dir=Path(base) / f"cache-{rank}",
    )
    seconds = timed(lambda: ckpt.save(1, {"model": model, "optim": opt}))
    retries = sum(f.data.get("retries", 0) for f in ckpt.last_findings if f.code == "C203")
    if rank == 0:
        q.put({"seconds": seconds, "retries_reported": retries})
    dist.barrier()
    dist.destroy_process_group()


def spawn(target: Any, world: int, *args: Any) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = Path(tempfile.gettempdir()) / f"bench-rdzv-{uuid.uuid4().hex}"
    procs = [ctx.Process(target=target, args=(r, world, str(init), *args, q)) for r in range(world)]
    for p in procs:
        p.start()
    result = q.get(timeout=1800)
    for p in procs:
        p.join(600)
    init.unlink(missing_ok=True)
    return result


def storm(mb: int, capacity: int, hold_ms: int, rate: float, base: Path) -> list[dict]:
    from s3_server import Traffic, make_bucket, s3_server

    rows = []
    for calm in (False, True):
        traffic = Traffic(capacity=capacity, hold_s=hold_ms / 1000)
        with s3_server(traffic) as endpoint:
            make_bucket(endpoint, "bench")
            traffic.reset()
            res = spawn(storm_entry, 8, endpoint, mb, calm, rate, str(base / f"storm-{calm}"))
            rows.append(
                res
                | {
                    "calm": calm,
                    "peak": traffic.peak,
                    "slowdowns": traffic.slowdowns,
                    "requests": traffic.requests,
                }
            )
    return rows


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64, help="MiB of fp32 weights (AdamW: 3x state)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--storm-mb", type=int, default=8, help="MiB of weights in the 8-rank run")
    ap.add_argument("--capacity", type=int, default=3, help="requests in flight before 503s")
    ap.add_argument("--rate-mb-s", type=float, default=50.0, help="rate limit per rank (calm)")
    ap.add_argument("--hold-ms", type=int, default=50, help="time the store holds a request")
    ap.add_argument("--no-storm", action="store_true")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="bench-checkpointer-"))
    print(f"command: python benchmarks/bench_checkpointer.py {' '.join(sys.argv[1:])}")
    print(describe())
    print(f"torch {torch.__version__}; state: {args.mb} MiB weights + AdamW moments, 2 ranks\n")
    try:
        r = spawn(sharded_entry, 2, str(base / "sharded"), args.mb, args.rounds)
        print(
            "| what | Checkpointer median s | baseline | baseline median s | ratio of medians "
            "| per-round ratios: median (quartiles) |"
        )
        print("|---|---:|---|---:|---:|---|")
        for ours, theirs, label, blabel in (
            ("tg", "dcp", "sharded save (verified, committed)", "dcp.save"),
            ("tg_load", "dcp_load", "load_latest (verify + restricted unpickler)", "dcp.load"),
            ("stall", "sync", "async_save: caller blocked", "sync save: caller blocked"),
        ):
            a, b = med(r[ours]), med(r[theirs])
            per = sorted(x / y for x, y in zip(r[ours], r[theirs], strict=True))
            q1, q2, q3 = statistics.quantiles(per, n=4) if len(per) > 1 else per * 3
            print(
                f"| {label} | {a:.3f} | {blabel} | {b:.3f} | {a / b:.3f} "
                f"| **{statistics.median(per):.3f}** ({q1:.2f}-{q3:.2f}) |"
            )
        if not args.no_storm:
            print(
                f"\n8 ranks, {args.storm_mb} MiB weights + AdamW moments, S3 throttling above "
                f"{args.capacity} requests in flight, {args.hold_ms} ms per request:\n"
            )
            print(
                "| setting | peak requests in flight | 503 SlowDown (= retries) | retries we "
                "reported | requests | save s |"
            )
            print("|---|---:|---:|---:|---:|---:|")
            for row in storm(args.storm_mb, args.capacity, args.hold_ms, args.rate_mb_s, base):
                name = (
                    f"stagger 0.5 s/rank + {args.rate_mb_s:g} MB/s per rank"
                    if row["calm"]
                    else "no stagger, no rate limit"
                )
                print(
                    f"| {name} | {row['peak']} | {row['slowdowns']} | "
                    f"{row['retries_reported']} | {row['requests']} | {row['seconds']:.2f} |"
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
