"""The arithmetic of one optimizer step and of one evaluation, read top to bottom (nanoGPT-style).

The loop (`train/spine.py`) decides when to step, evaluate, checkpoint and act on findings;
this module only computes. It never syncs with the host except where marked: the loss and the
gradient norm, which every guard needs, once per step (none when the guard decides on the
device, `guards.decide_on`).

Each rank reads its micro-batches from the run's `ElasticSampler` (`micro_batch_ids`: its
contiguous slice of the global batch in micro-batches of `batch_size / ranks` sequences,
`grad_accum` of them, or under a batch-size ramp (`train.batch_ramp`) as many as the step's size
holds). The global batch, and so its hash, does not depend on the rank count.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from trainguard.config.schema import Recipe
from trainguard.data.order import batch_hash
from trainguard.data.sampler import ElasticSampler
from trainguard.guard.judgement import Judgement
from trainguard.train.optim import Optimizer
from trainguard.train.schedule import LrSchedule
from trainguard.train.world import World


@dataclass
class StepResult:
    """What one forward/backward over the global batch produced, before the update."""

    loss: float | torch.Tensor
    """A float, or a 0-dim tensor on the device when asked for without a host sync."""
    grad_norm: float | torch.Tensor
    batch_hash: str
    ids: np.ndarray
    position: int = -1
    """The global position in the elastic order the batch starts at (`trainguard batch`)."""
    data_time_s: float = 0.0
    """Seconds in the data phase: choosing the sample ids and reading every micro-batch."""
    router_stats: dict[str, dict] | None = None
    """Each MoE layer's router counts for this step (all ranks summed); None when dense."""
    router_counts: torch.Tensor | None = None
    """The device path: the same counts unread, a snapshot on the device
    (`StepMath.router_stats_from(router_counts.tolist())` once the step is read back)."""


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class StepMath:
    """The arithmetic of a step and of an evaluation over the model, optimizer and the run's
    sampler; it decides nothing (the loop, `train/spine.py`, does)."""

    def __init__(
        self,
        recipe: Recipe,
        model: torch.nn.Module,
        optimizer: Optimizer,
        train_data,  # data.shards.TokenDataset
        val_data,
        sampler: ElasticSampler,
        *,
        world: World | None = None,
        device: torch.device | None = None,
        ddp_model: torch.nn.Module | None = None,
        on_phase: Callable[[str, int], None] | None = None,
        on_loss: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
        schedule: LrSchedule | None = None,
    ) -> None:
        """`on_phase(phase, step)`: the step enters a phase (the callbacks' `on_phase`);
        `on_loss(step, loss)`: each micro-batch's loss before its backward, replaced by what it
        returns (None: no callback looks at it, nothing is called)."""
        self.recipe = recipe
        self.model = model
        # The module we call forward/backward on: the DDP wrapper when data parallel.
        self.net = ddp_model if ddp_model is not None else model
        self.optimizer = optimizer
        self.train_data = train_data
        self.val_data = val_data
        self.world = world or World()
        self.device = device or torch.device("cpu")
        self.on_phase = on_phase or (lambda phase, step: None)
        self.on_loss = on_loss
        t = recipe.train
        self.seq_len = recipe.data.seq_len
        # The run's sampler: each step's global batch (its size under a ramp, its skips).
        self.sampler = sampler
        self.params = [p for p in model.parameters() if p.requires_grad]
        # The recipe's cosine unless a resume extended it (train/schedule.py).
        self.schedule = schedule or LrSchedule.planned(t.warmup_steps, t.min_lr_ratio, t.max_steps)
        # MoE layers whose counters the step reads in its one host sync (model/moe.py).
        self.routers = [
            (name, m)
            for name, m in model.named_modules()
            if callable(getattr(m, "router_counts", None))
        ]

    def _micro_batch(self, dataset, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples `ids` of `dataset` (the train or the validation split) as inputs, targets."""
        tokens = torch.from_numpy(dataset.samples(ids, self.seq_len))  # (b, T+1)
        tokens = tokens.to(self.device, non_blocking=True)
        return tokens[:, :-1], tokens[:, 1:]  # inputs (b, T), targets (b, T)

    def forward_backward(self, step: int, position: int, on_host: bool = True) -> StepResult:
        """Gradients of the global batch at `position`, accumulated over micro-batches.

        `step` is the 0-based index of the step being computed (the sampler's, the `step` of
        its log row). `on_host=False` leaves the loss and gradient norm on the device (no host
        sync) for the guard's device path.
        """
        t = self.recipe.train
        for _, router in self.routers:
            router.reset_router_stats()  # count this step's forwards only (not evals, reruns)
        data_t0 = time.perf_counter()
        self.on_phase("data", step)
        # (G,) global, rank-independent: the sampler's batch of this step, which starts at
        # `position` (the loop reads it from the same sampler); its hash is the row's.
        ids = self.sampler.batch_ids(step)
        # This rank's slice in micro-batches: grad_accum, or fewer while a ramp is below it.
        micro = self.sampler.micro_batch_ids(step)  # A x (G/W/A,)
        accum = len(micro)
        data_time = time.perf_counter() - data_t0
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        for k, micro_ids in enumerate(micro):  # (G/W/A,) each
            data_t0 = time.perf_counter()
            x, y = self._micro_batch(self.train_data, micro_ids)
            data_time += time.perf_counter() - data_t0
            last = k == accum - 1
            # DDP all-reduces gradients only on the last micro-batch of the step.
            sync = (
                contextlib.nullcontext() if last or self.net is self.model else self.net.no_sync()
            )
            with sync:
                self.on_phase("forward", step)
                with _autocast(t.precision, self.device):
                    logits = self.net(x)  # (b, T, V)
                    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
                    if self.on_loss is not None:  # a callback's (the drills' poisoned batch)
                        loss = self.on_loss(step, loss)
                    aux = self.model.aux_loss() if hasattr(self.model, "aux_loss") else 0.0
                self.on_phase("backward", step)
                ((loss + aux) / accum).backward()
            loss_sum += loss.detach()
        self.on_phase("optimizer", step)
        # Norm before clipping: the guard judges the raw gradient. max_norm=inf only measures.
        clip = t.grad_clip if t.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, clip)
        mean_loss = self.world.all_reduce_mean(loss_sum / accum)
        counts = self._router_counts()
        if not on_host:  # the device path: the MoE counters are read with the step's values
            snapshot = counts.clone() if counts is not None else None  # the next step resets
            return StepResult(
                mean_loss, grad_norm, batch_hash(ids), ids, position, data_time, None, snapshot
            )
        # One deliberate host sync per step: the guards need both numbers (and the MoE
        # counters, read with them; float64 holds both exactly).
        values = torch.stack([mean_loss, grad_norm.to(mean_loss.dtype)]).double()
        if counts is not None:
            values = torch.cat([values, counts.to(values.device, torch.float64)])
        stats = values.tolist()
        return StepResult(
            loss=stats[0],
            grad_norm=stats[1],
            batch_hash=batch_hash(ids),
            ids=ids,
            position=position,
            data_time_s=data_time,
            router_stats=self.router_stats_from(stats[2:]) if counts is not None else None,
        )

    def _router_counts(self) -> torch.Tensor | None:
        """Every MoE layer's counters in one tensor, summed over the ranks (so that every rank
        judges the same numbers); no host sync."""
        if not self.routers:
            return None
        counts = torch.cat([router.router_counts() for _, router in self.routers])
        if self.world.size > 1:
            counts = counts.clone()
            torch.distributed.all_reduce(counts, op=torch.distributed.ReduceOp.SUM)
        return counts

    def router_stats_from(self, values: list[float]) -> dict[str, dict]:
        """`{layer: router_stats}` from the read values of the step's router counters."""
        out, start = {}, 0
        for name, router in self.routers:
            n = router.router_counts().numel()
            out[name] = router.stats_from_counts(values[start : start + n])
            start += n
        return out

    def apply_update(self, step: int, judgement: Judgement | None = None) -> float:
        """Set step `step`'s (0-based) learning rates and apply the update; with `judgement`
        (`Guard.judge`'s) as judged: applied, skipped, or masked on the device.

        Returns train.lr's scheduled value, the `lr` of the step's log row."""
        t = self.recipe.train
        # One schedule factor for every group; each group scales its own peak (Muon's matrices
        # and AdamW's embeddings have different peaks). Groups without `peak_lr` come from a
        # checkpoint written before groups carried it: their peak was train.lr.
        factor = self.schedule.factor(step)
        for group in self.optimizer.param_groups:
            group["lr"] = group.get("peak_lr", t.lr) * factor
        if judgement is None:
            self.optimizer.step()
        else:
            judgement.optimizer_step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return t.lr * factor

    def discard_update(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation loss (nats/token) and bits per byte on a fixed, evenly spread sample."""
        t = self.recipe.train
        n_val = self.val_data.num_samples(self.seq_len)
        n = min(n_val, t.eval_batches * t.batch_size)
        ids = np.linspace(0, n_val - 1, n).astype(np.int64)
        was_training = self.model.training
        self.model.eval()
        total, count = 0.0, 0
        for start in range(0, n, t.batch_size):
            x, y = self._micro_batch(self.val_data, ids[start : start + t.batch_size])
            with _autocast(t.precision, self.device):
                logits = self.model(x)  # (b, T, V)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")
            total += loss.item()  # host sync: evaluation only, not the hot path
            count += y.numel()
        self.model.train(was_training)
        val_loss = total / max(count, 1)
        val_bpb = val_loss / math.log(2) / self.val_data.bytes_per_token
        return {"val_loss": val_loss, "val_bpb": val_bpb}
