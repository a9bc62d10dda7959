"""The guard's host sync: training steps/s with `Guard.step` (reads the loss and the gradient
norm with `.item()`), with `Guard.step_async` (decides on the device, reads back one step
later), each also writing the run record (`Guard(run_dir=...)` with an `ElasticSampler`
attached: metrics.jsonl rows with position and batch hash, run.json; "+record"), and with no
guard at all (the baseline), side by side.

Same model (trainguard's GPT), data (random tokens), fused AdamW and steps for all three;
alternating rounds, medians of steps/s, ratios to the baseline of the same round. On a GPU the
synchronous guard drains the launch queue once per step (the host waits for the step to end
before it can queue the next one), which costs most on small, launch-bound steps; on a CPU
there is no queue to drain and the three should be close.

    python benchmarks/bench_guard_sync.py [--device cuda] [--steps 50] [--rounds 5]
        [--d-model 512] [--layers 8] [--batch 16] [--seq 256]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from machine import describe

from trainguard.config.schema import ModelConfig
from trainguard.data.sampler import ElasticSampler
from trainguard.guard.core import Guard
from trainguard.model.gpt import GPT

VOCAB = 4096


def make(args: argparse.Namespace, device: torch.device) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=args.layers, d_model=args.d_model, n_heads=args.d_model // 64)
    model = GPT(cfg, vocab_size=VOCAB, seq_len=args.seq).to(device)
    # fused: torch's fastest AdamW on CUDA, and the device path skips it through found_inf.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    return model, opt


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(mode: str, args: argparse.Namespace, device: torch.device) -> float:
    """Steps per second of `args.steps` steps after 3 warm-up steps."""
    model, opt = make(args, device)
    gen = torch.Generator(device="cpu").manual_seed(1)
    batches = [
        torch.randint(0, VOCAB, (args.batch, args.seq + 1), generator=gen).to(device)
        for _ in range(4)
    ]
    folder = tempfile.TemporaryDirectory(prefix="bench-guard-record-")
    guard = Guard(run_dir=folder.name if mode.endswith("+record") else None)
    if guard.record is not None:  # the record's step rows: loss, norm, lr, position, hash
        sampler = ElasticSampler(1 << 20, global_batch_size=args.batch, seed=0)
        guard.record.attach(sampler=sampler, optimizer=opt, config=vars(args))
    start = 0.0
    for step in range(args.steps + 3):
        if step == 3:
            sync(device)
            start = time.perf_counter()
        tokens = batches[step % len(batches)]
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        if mode.startswith("sync"):
            d = guard.step(step, loss=loss, model=model, optimizer=opt)
            if d.apply:
                opt.step()
        elif mode.startswith("async"):
            pending = guard.step_async(step, loss=loss.detach(), model=model)
            pending.optimizer_step(opt)
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
    if mode.startswith("async"):
        guard.flush()
    sync(device)
    rate = args.steps / (time.perf_counter() - start)
    guard.close()
    folder.cleanup()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (shared machine)")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    print(describe())
    print(
        f"device {device}; GPT {args.layers} layers, d_model {args.d_model}, batch {args.batch} "
        f"x {args.seq} tokens, fused AdamW; {args.steps} steps per run, {args.rounds} rounds\n"
    )
    modes = ("none", "sync", "sync+record", "async", "async+record")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):  # alternate, so drift hits all three alike
        for m in modes:
            rates[m].append(run(m, args, device))
        line = "  ".join(f"{m} {rates[m][-1]:.1f}" for m in modes)
        print(f"round {r}: steps/s  {line}")
    med = {m: statistics.median(v) for m, v in rates.items()}
    ratio = {m: statistics.median(a / b for a, b in zip(rates[m], rates["none"], strict=True))
             for m in modes}  # fmt: skip
    print("\n| guard | steps/s (median) | ratio to no guard (median of per-round ratios) |")
    print("|---|---|---|")
    names = {
        "none": "none (baseline)",
        "sync": "Guard.step",
        "sync+record": "Guard.step + run record",
        "async": "Guard.step_async",
        "async+record": "Guard.step_async + run record",
    }
    for m in modes:
        print(f"| {names[m]} | {med[m]:.1f} | {ratio[m]:.3f} |")


if __name__ == "__main__":
    main()
