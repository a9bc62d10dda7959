"""A guarded FSDP2 training loop for a tiny GPT, nanoGPT-style, on trainguard's public parts.

    torchrun --nproc-per-node 2 examples/fsdp2_loop.py --out runs/fsdp2   # CPU: gloo
    torchrun --nproc-per-node 8 examples/fsdp2_loop.py --out runs/fsdp2   # GPUs: nccl, bf16
    torchrun --nproc-per-node 1 examples/fsdp2_loop.py --out runs/fsdp2   # one process

What differs from ddp_loop.py: the model is sharded with `fully_shard` (every rank holds a
slice of every parameter and its optimizer state), so
- `Checkpointer` sees the FSDP2 module and saves through torch.distributed.checkpoint: every
  rank writes its own shards, rank 0 commits a manifest of every rank's files once all have
  finished; a checkpoint saved by N ranks loads on M (DCP reshards it);
- the guard's replica check has nothing to compare (no two ranks hold the same shard): it says
  so once (H203, info) instead of passing silently;
- gradient accumulation turns the reduce-scatter off until the last micro-batch.

Rank 0 logs every step's global batch hash to OUT/steps.jsonl and the gathered final weights
(and their hash) to OUT/model.safetensors; the guard's findings go to OUT/guard.jsonl.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader
from toy_lm import VOCAB, Faults, MarkovTokens, StepLog, arguments, export_weights, lr_at, tiny_gpt

import trainguard

NUM_SAMPLES, GLOBAL_BATCH, MICRO_BATCH = 512, 8, 2  # sequences; the global batch for any world


def main() -> None:
    args = arguments(__doc__)  # --out, --max-steps, --checkpoint-every, --device, --inject
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ["LOCAL_RANK"])  # FSDP2 needs a process group: use torchrun
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
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
    model = tiny_gpt(device)
    for block in model.transformer.h:  # one all-gather per block, then the rest (tied head)
        fully_shard(block)
    fully_shard(model)
    # Built after fully_shard: the optimizer holds the DTensor shards, not the full tensors.
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=lr_at(0, args.max_steps), betas=(0.9, 0.95)
    )
    # Rank 0's guard writes OUT/guard.jsonl; the others keep their hang reports apart.
    guard = trainguard.Guard(run_dir=args.out / (f"rank{rank}" if rank else ""), distributed=True)
    state = {"model": model, "optimizer": optimizer, "sampler": sampler, "guard": guard}
    checkpointer = trainguard.Checkpointer(args.out / "checkpoints", keep=3)  # sharded: found
    # The run record (OUT/run.json, OUT/metrics.jsonl), as in ddp_loop.py: `trainguard report
    # OUT`, and the checkpoint root a `drill --chaos --command` soak reads.
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
            # Keep unsharded gradients until the last micro-batch, then reduce-scatter once.
            model.set_requires_gradient_sync(micro == len(held[s]) - 1)
            with guard.phase("forward", s), bf16:
                logits = model(x)
                micro_loss = F.cross_entropy(logits.view(-1, VOCAB).float(), y.view(-1))
                micro_loss = micro_loss / sampler.accum_steps
            with guard.phase("backward", s):
                micro_loss.backward()
            loss += micro_loss.detach()  # stays on the device: no sync per micro-batch
        # The norm before clipping; over DTensor shards a collective: the whole model's norm.
        return loss, torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    def settled(what) -> int | None:  # a rerun, a rollback (the step to go on from), a halt
        done = guard.settle(
            what, rerun=forward_backward, checkpointer=checkpointer, state=state, sampler=sampler
        )
        return done.rolled_back_to

    step = checkpointer.load_latest(state) or 0  # every rank; DCP reshards into this world
    guard.report(checkpointer.last_findings)  # a damaged step passed over (C101) on record
    sampler.set_step(step)  # the next iterator starts at this step's global batch
    batches, held = iter(loader), {}
    while step < args.max_steps:
        faults.at_step(step, rank)
        held = {step - 1: held[step - 1]} if step - 1 in held else {}  # kept for a rerun
        held[step], read = [], []  # this step's micro-batches; rank 0's sample ids
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
        judged = guard.judge(step, loss=loss, grad_norm=grad_norm, model=model, optimizer=optimizer)
        log.step(step, sampler, read, loss, judged.known.action if judged.known else "")
        back = settled(judged)  # a rollback restores the checkpoint, skips the bad batches
        if back is None:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, args.max_steps)
            with guard.phase("optimizer", step):
                judged.optimizer_step(optimizer)  # applied, or skipped as judged
            optimizer.zero_grad(set_to_none=True)
            saving = (step + 1) % args.checkpoint_every == 0 or step + 1 == args.max_steps
            # Plain FSDP2 has no replicas to hash (H203 once; with HSDP the shards' replicas
            # are compared before every save); the monitored barrier names a hung rank.
            back = settled(guard.after_update(step, model, optimizer, checkpoint_due=saving))
        if back is not None:
            step = back
            sampler.set_step(step)
            batches = iter(loader)  # a new iterator from the restored step
            continue
        step += 1
        if saving:  # every rank writes its own shards: under the checkpoint's budget
            with guard.phase("checkpoint", step):
                checkpointer.save(step, state)

    digest = export_weights(model, args.out / "model.safetensors", rank)  # gathers the shards
    log.write(step=step, final=True, weights_hash=digest)
    if rank == 0:
        print(f"{step} steps; weights hash {digest}")
    checkpointer.close()
    guard.close()
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
