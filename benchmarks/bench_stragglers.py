"""Stragglers (H202): detection step and false alarms over many seeds, new vs old detector.

Two parts:

1. **Simulated steps, many seeds.** Per-rank phase timings of a synchronous data-parallel step,
   fed through the shipped detector (`StragglerMonitor.observe`, the code a run uses) and the
   old one (the busy-time scores against the fastest rank and the rank's own history, read from
   git at BASELINE, fed with its 20-step interval sums as a run fed it). The model of a step:
   every rank begins together (the step barrier); its data, forward and backward compute take
   base times (a 20 ms step, a tiny model's; 10% / 40% / 40% / 10%) times a per-rank, per-step
   jitter of 0.8-1.25; the ranks leave the step barrier up to 0.5 ms apart; the all-reduce at
   the end of backward releases every rank when the last one arrives (the others' backward wall
   time grows by their wait); then the optimizer. A shared machine adds to each phase's wall
   time (not its CPU time) descheduling delays, exponential: with `idle` 2% of phases get one
   of mean 1 ms; with `load` 20% of mean 3 ms and 2% of mean 20 ms; with `heavy` 40% of mean
   5 ms, 5% of mean 30 ms and 1% of mean 100 ms; and the CPU time itself grows by up to 30%
   (`load`) or 60% (`heavy`): cache and memory contention. Faults, on rank 1 (fault runs under
   `load`): `slow_from_0` and `slow_from_30` (its forward and backward compute 3x longer:
   busy), `cpu_burn` (+40 ms of CPU in its forward from step 30), `sleep` (+40 ms asleep in
   its forward from step 30: a device sync, a wait), `slow_loader` (+40 ms waiting in its data
   phase from step 30). Each run has 120 steps; warm-up (the first 2 steps) is left out as a run
   leaves it out. Detection step: the step of the first H202 naming rank 1, counted from the
   fault's onset (from step 0 for `slow_from_0`); the finding is reported at the next gather,
   up to `straggler_interval - 1` steps later. False alarm: a run with an H202 naming any other
   rank (any rank on the clean runs).

2. **Real 2-process gloo runs.** `Guard(distributed=...)` in a DDP loop (a 64-256-1 MLP, one
   thread per process, the default distributed settings but `replica_check_interval=0`), 60
   steps, the faults injected for real (a CPU burn, `time.sleep`), a few runs each, on the
   shared machine as it is.

    python benchmarks/bench_stragglers.py [--seeds 500] [--ranks 2,8] [--real 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from machine import describe

from trainguard.guard.detectors.straggler import PHASES, StragglerMonitor

BASELINE = "1062d8c"
"""The commit before arrival skew: its straggler.py is the `old` detector."""
STEPS, WARMUP, ONSET, BASE_S, EXTRA_S = 120, 2, 30, 0.02, 0.04
START_SKEW_S = 0.0005  # ranks leave the step barrier up to this far apart
SHARES = (0.1, 0.4, 0.4, 0.1)  # data, forward, backward, optimizer
LOADS = {  # (probability, mean delay s) pairs per phase, CPU-time inflation
    "idle": ([(0.02, 0.001)], 0.0),
    "load": ([(0.20, 0.003), (0.02, 0.020)], 0.3),
    "heavy": ([(0.40, 0.005), (0.05, 0.030), (0.01, 0.100)], 0.6),
}
FAULTS = ("slow_from_0", "slow_from_30", "cpu_burn", "sleep", "slow_loader")


def old_monitor() -> type:
    """StragglerMonitor as it was at BASELINE (it imports only the stdlib and findings)."""
    src = subprocess.run(
        ["git", "show", f"{BASELINE}:src/trainguard/guard/detectors/straggler.py"],
        cwd=Path(__file__).resolve().parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("straggler_before")
    exec(compile(src, "straggler_before.py", "exec"), module.__dict__)
    return module.StragglerMonitor


def simulate_step(
    step: int, ranks: int, fault: str | None, load: str, rng: random.Random
) -> tuple[list[list[float]], list[list[float]]]:
    """One step's wall and CPU seconds per rank and phase (see the module docstring)."""
    delays, inflate = LOADS[load]
    walls, cpus, arrive, start = [], [], [], []
    for r in range(ranks):
        start.append(rng.uniform(0, START_SKEW_S))
        cpu = [BASE_S * s * rng.uniform(0.8, 1.25) * (1 + rng.uniform(0, inflate)) for s in SHARES]
        wall = list(cpu)
        for p in range(len(PHASES)):
            for prob, mean in delays:
                if rng.random() < prob:
                    wall[p] += rng.expovariate(1.0 / mean)
        if r == 1 and fault is not None and step >= (0 if fault == "slow_from_0" else ONSET):
            if fault in ("slow_from_0", "slow_from_30"):
                for p in (1, 2):
                    cpu[p] *= 3
                    wall[p] += cpu[p] * 2 / 3
            elif fault == "cpu_burn":
                cpu[1] += EXTRA_S
                wall[1] += EXTRA_S
            elif fault == "sleep":
                wall[1] += EXTRA_S
            elif fault == "slow_loader":
                wall[0] += EXTRA_S
        walls.append(wall)
        cpus.append(cpu)
        arrive.append(start[r] + sum(wall[:3]))  # at the all-reduce, on one clock
    for r in range(ranks):
        walls[r][2] += max(arrive) - arrive[r]  # waiting in the all-reduce
    return walls, cpus


def old_interval(walls: list[list[float]], cpus: list[list[float]]) -> dict[str, float]:
    """One step as the old PhaseTimer booked it (busy CPU per group, the rest as comm)."""
    busy = {"data": cpus[0], "fwd_bwd": cpus[1] + cpus[2], "optimizer": cpus[3]}
    return {**busy, "comm": sum(walls) - sum(cpus), "steps": 1.0}


def one_run(ranks: int, fault: str | None, load: str, seed: int, old_cls: type | None) -> dict:
    rng = random.Random(seed)
    new, old = StragglerMonitor(), old_cls() if old_cls is not None else None
    first: dict[str, tuple[int, int] | None] = {"new": None, "old": None}
    sums: list[dict[str, float]] = []
    for step in range(STEPS):
        walls, cpus = simulate_step(step, ranks, fault, load, rng)
        if step >= WARMUP:
            for f in new.observe(step, walls, cpus):
                first["new"] = first["new"] or (step, f.rank)
        if old is None:
            continue
        steps = [old_interval(walls[r], cpus[r]) for r in range(ranks)]
        if sums:
            steps = [{k: a[k] + b[k] for k in a} for a, b in zip(sums, steps, strict=True)]
        sums = steps
        if step % 20 == 0:  # the old gather: every 20 steps, step 0 included
            for f in old.update(step, sums):
                first["old"] = first["old"] or (step, f.rank)
            sums = []
    return first


def sweep(ranks: int, seeds: int, old_cls: type | None) -> dict[tuple[str, str], dict]:
    cases = [(f, "load") for f in FAULTS] + [(None, load) for load in LOADS]
    out = {}
    for fault, load in cases:
        res: dict[str, dict] = {"new": {"det": [], "fa": 0}, "old": {"det": [], "fa": 0}}
        for seed in range(seeds):
            first = one_run(ranks, fault, load, 1000 * ranks + seed, old_cls)
            for name, hit in first.items():
                if hit is None:
                    continue
                step, rank = hit
                if fault is None or rank != 1:
                    res[name]["fa"] += 1
                else:
                    res[name]["det"].append(step - (0 if fault == "slow_from_0" else ONSET))
        out[(fault or "clean", load)] = res
    return out


# -- real 2-process gloo runs --------------------------------------------------------------------
REAL_STEPS = 60
REAL = {  # rank 1's fault: (phase, seconds, busy) from step `onset`
    "clean": None,
    "slow_from_0 (burn 30 ms in forward)": ("forward", 0.03, True, 0),
    "sleep 30 ms in forward from 30": ("forward", 0.03, False, 30),
    "slow loader: 30 ms in data from 30": ("data", 0.03, False, 30),
}


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _real_worker(rank: int, tmp: str, fault: tuple | None) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from trainguard import Guard
    from trainguard.config.distributed import DistributedConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=2)
    guard = Guard(
        run_dir=f"{tmp}/rank{rank}", distributed=DistributedConfig(replica_check_interval=0)
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    t0 = time.perf_counter()
    for step in range(REAL_STEPS):
        slow = fault is not None and rank == 1 and step >= fault[3]
        for phase in ("data", "forward"):
            with guard.phase(phase, step):
                if slow and fault[0] == phase:
                    _burn(fault[1]) if fault[2] else time.sleep(fault[1])
                if phase == "data":
                    x = torch.randn(32, 64)
                else:
                    loss = F.mse_loss(ddp(x), torch.zeros(32, 1))
        with guard.phase("backward", step):
            loss.backward()
        guard.step(step, loss=loss, model=model, optimizer=optimizer)
        with guard.phase("optimizer", step):
            optimizer.step()
            optimizer.zero_grad()
        guard.end_step(step, model, optimizer)
    Path(f"{tmp}/time{rank}").write_text(str((time.perf_counter() - t0) / REAL_STEPS))
    guard.close()
    dist.destroy_process_group()


def real_run(fault: tuple | None) -> tuple[list[dict], float]:
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_real_worker, args=(r, tmp, fault)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
        log = Path(f"{tmp}/rank0/guard.jsonl")
        rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        step_s = float(Path(f"{tmp}/time0").read_text())
    return [r for r in rows if r.get("code") == "H202"], step_s


# -- report --------------------------------------------------------------------------------------
def _det(res: dict, seeds: int) -> str:
    det = res["det"]
    if not det:
        return f"0/{seeds}"
    return f"{len(det)}/{seeds}, median {statistics.median(det):g} (max {max(det)})"


def markdown(results: dict[int, dict], real: dict[str, list], seeds: int, command: str) -> str:
    lines = [
        f"`{command}`",
        "",
        describe(),
        "",
        "Simulated steps (detection: runs naming rank 1, steps from the onset to the finding's "
        "step, median and max; false alarms: runs naming a wrong rank, or any on clean runs):",
        "",
        "| ranks | case | load | new: detected, steps | new: false alarms | old: detected, steps "
        "| old: false alarms |",
        "|---|---|---|---|---|---|---|",
    ]
    for ranks, res in results.items():
        for (case, load), r in res.items():
            lines.append(
                f"| {ranks} | {case} | {load} | {_det(r['new'], seeds)} | {r['new']['fa']}/{seeds} "
                f"| {_det(r['old'], seeds)} | {r['old']['fa']}/{seeds} |"
            )
    if real:
        lines += [
            "",
            f"Real 2-process gloo runs, {REAL_STEPS} steps each (H202 on rank 0: step, rank, "
            "phase, kind, ms behind; mean step time):",
            "",
            "| case | runs | findings |",
            "|---|---|---|",
        ]
        for case, runs in real.items():
            shown = []
            for found, step_s in runs:
                fs = ", ".join(
                    f"step {f['step']} rank {f['rank']} {f['data']['phase']} {f['data']['kind']} "
                    f"{f['data']['behind_s'] * 1e3:.0f} ms"
                    for f in found
                )
                shown.append(f"{fs or 'none'} ({step_s * 1e3:.0f} ms/step)")
            lines.append(f"| {case} | {len(runs)} | {'; '.join(shown)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=500)
    ap.add_argument("--ranks", default="2,8")
    ap.add_argument("--real", type=int, default=3, help="real gloo runs per case (0: none)")
    ap.add_argument("--no-old", action="store_true", help="skip the old detector")
    args = ap.parse_args()
    print(describe(), flush=True)
    old_cls = None if args.no_old else old_monitor()
    results = {}
    for ranks in (int(x) for x in args.ranks.split(",")):
        t0 = time.perf_counter()
        results[ranks] = sweep(ranks, args.seeds, old_cls)
        print(f"{ranks} ranks: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    real: dict[str, list] = {}
    for case, fault in REAL.items():
        for _ in range(args.real):
            real.setdefault(case, []).append(real_run(fault))
            print(f"real {case}: {real[case][-1]}", file=sys.stderr, flush=True)
    command = "python benchmarks/bench_stragglers.py " + " ".join(sys.argv[1:])
    print(markdown(results, real, args.seeds, command.strip()))


if __name__ == "__main__":
    main()
