"""A guarded DDP training loop for a tiny GPT, nanoGPT-style, on trainguard's public parts.

    torchrun --nproc-per-node 2 examples/ddp_loop.py --out runs/ddp    # CPU: gloo
    torchrun --nproc-per-node 8 examples/ddp_loop.py --out runs/ddp    # GPUs: nccl, bf16
    python examples/ddp_loop.py --out runs/ddp                         # one process

- `ElasticSampler`: the global batch of step s is a pure function of (seed, s, recorded skips),
  whatever the number of processes; each rank reads its slice in micro-batches.
- `Checkpointer`: verified checkpoints of the model, optimizer, sampler and guard, written by
  rank 0 (every rank's RNG states included). Run the same command again after a crash, with
  any number of processes: it resumes from the newest checkpoint that verifies and reads the
  same global batches (the weights match an uninterrupted run bitwise on the same world size).
- `Guard(distributed=True)`: judges every update before it is applied (skip a NaN or spiking
  one and rerun it on its batch: hardware R205 or data R206; roll back on a storm of them, halt
  after `max_rollbacks`), compares the replicas before each checkpoint, names stragglers, hung
  ranks (R301) and dead ones (R302, with the signal).

Rank 0 logs every step's global batch hash to OUT/steps.jsonl and the final weights (and their
hash) to OUT/model.safetensors; the guard's findings go to OUT/guard.jsonl, and its run record
(every step's loss, gradient norm, learning rate, batch, decision) to OUT/metrics.jsonl and
OUT/run.json, which `trainguard report`, `batch`, `eval` and `watch` read.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from toy_lm import VOCAB, Faults, MarkovTokens, StepLog, arguments, export_weights, lr_at, tiny_gpt

import trainguard

NUM_SAMPLES, GLOBAL_BATCH, MICRO_BATCH = 512, 8, 2  # sequences; the global batch for any world


def main() -> None:
    args = arguments(__doc__)  # --out, --max-steps, --checkpoint-every, --device, --inject

    # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK; a plain `python` run is one process.
    distributed = "RANK" in os.environ
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    torch.set_num_threads(1)  # a tiny model: more threads only add overhead
    bf16 = torch.autocast("cuda", torch.bfloat16) if use_cuda else contextlib.nullcontext()
    faults = Faults(args.inject)

    # rank and world size come from torch.distributed; the order does not depend on them.
    sampler = trainguard.ElasticSampler(
        NUM_SAMPLES,
        global_batch_size=GLOBAL_BATCH,
        seed=0,
        max_steps=args.max_steps,
        micro_batch_size=MICRO_BATCH,
    )
    dataset = MarkovTokens(NUM_SAMPLES, empty=faults.empty_samples(sampler))
    loader = DataLoader(dataset, sampler=sampler, batch_size=sampler.micro_batch_size)
    raw = tiny_gpt(device)
    model = DDP(raw, device_ids=[local_rank] if use_cuda else None) if distributed else raw
    optimizer = torch.optim.AdamW(raw.parameters(), lr=lr_at(0, args.max_steps), betas=(0.9, 0.95))
    # Rank 0's guard writes OUT/guard.jsonl; the others keep their hang reports apart.
    guard = trainguard.Guard(run_dir=args.out / (f"rank{rank}" if rank else ""), distributed=True)
    state = {"model": raw, "optimizer": optimizer, "sampler": sampler, "guard": guard}
    checkpointer = trainguard.Checkpointer(args.out / "checkpoints", keep=3)
    # The run record (OUT/run.json, OUT/metrics.jsonl): `trainguard report/batch/eval OUT`.
    config = {"max_steps": args.max_steps, "global_batch": GLOBAL_BATCH, "vocab": VOCAB}
    seq = len(dataset[0][1])  # tokens per sample: the record's `tokens`
    guard.record.attach(
        sampler=sampler, config=config, checkpoints=checkpointer.root, tokens_per_sample=seq
    )
    log = StepLog(args.out / "steps.jsonl", rank)

    def forward_backward(s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step s's loss and pre-clip gradient norm over its micro-batches (`held[s]`); the
        guard calls it again to rerun a step it refused (R205 hardware / R206 data)."""
        loss = torch.zeros((), device=device)
        for micro, (x, y) in enumerate(held[s]):
            with guard.phase("forward", s), bf16:
                model.require_backward_grad_sync = micro == len(held[s]) - 1  # all-reduce once
                logits = model(x)
                micro_loss = F.cross_entropy(logits.view(-1, VOCAB).float(), y.view(-1))
                micro_loss = micro_loss / sampler.accum_steps
            with guard.phase("backward", s):
                micro_loss.backward()
            loss += micro_loss.detach()  # stays on the device: no sync per micro-batch
        # The norm before clipping: a 1000x spike clips to an ordinary 1.0.
        return loss, torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)

    def settled(what) -> int | None:  # a rerun, a rollback (the step to go on from), a halt
        done = guard.settle(
            what, rerun=forward_backward, checkpointer=checkpointer, state=state, sampler=sampler
        )
        return done.rolled_back_to

    step = checkpointer.load_latest(state) or 0  # every rank; restores `state` in place
    guard.report(checkpointer.last_findings)  # a damaged step passed over (C101) on record
    sampler.set_step(step)  # the next iterator starts at this step's global batch
    batches, held = iter(loader), {}
    while step < args.max_steps:
        faults.at_step(step, rank)
        held = {step - 1: held[step - 1]} if step - 1 in held else {}  # kept for a rerun
        held[step], read = [], []  # this step's micro-batches; rank 0's sample ids
        for group in optimizer.param_groups:  # this step's rate, in the record's step row
            group["lr"] = lr_at(step, args.max_steps)
        for _ in range(sampler.accum_steps):
            with guard.phase("data", step):
                ids, x, y = next(batches)
                held[step].append(
                    (x.to(device, non_blocking=True), y.to(device, non_blocking=True))
                )
            read.append(ids)
        loss, grad_norm = forward_backward(step)
        # Host sync: the guard reads the loss and the norm and averages them over the ranks
        # (a small gloo all-gather), so every rank takes the same decision.
        judged = guard.judge(step, loss=loss, grad_norm=grad_norm, model=raw, optimizer=optimizer)
        log.step(step, sampler, read, loss, judged.known.action if judged.known else "")
        back = settled(judged)  # a rollback restores the checkpoint, skips the bad batches
        if back is None:
            with guard.phase("optimizer", step):
                judged.optimizer_step(optimizer)  # applied, or skipped as judged
            optimizer.zero_grad(set_to_none=True)
            saving = (step + 1) % args.checkpoint_every == 0 or step + 1 == args.max_steps
            # Replica hashes before every save (a corrupt replica is never saved; host
            # sync), then a monitored barrier that names a hung rank. H201: a rollback.
            back = settled(guard.after_update(step, raw, optimizer, checkpoint_due=saving))
        if back is not None:
            step = back
            sampler.set_step(step)
            batches = iter(loader)  # a new iterator from the restored step
            continue
        step += 1
        if saving:  # collective: under the checkpoint's timeout budget, not the step's
            with guard.phase("checkpoint", step):
                checkpointer.save(step, state)  # `step` = completed steps

    digest = export_weights(raw, args.out / "model.safetensors", rank)
    log.write(step=step, final=True, weights_hash=digest)
    if rank == 0:
        print(f"{step} steps; weights hash {digest}")
    checkpointer.close()
    guard.close()
    log.close()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
