"""Fault injection points in the training loop, for fire drills and crash tests (the plan the
run reads; `drills/` launches runs with one). It sits below `train/`: the hot loop never
imports `drills/`.

A plan comes from the environment variable `TRAINGUARD_INJECT`, a comma-separated list of
`fault@step` items, for example `kill@7:backward,nan@12`. N is the 0-based index of the step
being computed, as every part and the metrics row count it. `trainguard run` drives a plan
through one callback (`train/callbacks/faults.py`) on its loop's hooks; with no plan there is
none.

Faults:
- `kill@N:PHASE`  SIGKILL this process when step N reaches PHASE (data, forward, backward,
  optimizer; or checkpoint / checkpoint_write: the checkpoint saved after step N, which holds
  N + 1 completed steps). With checkpoint_write rank 0's writer thread kills it mid-write
  while its step N + 1 waits in its data phase (at most WRITE_KILL_WAIT_S): the steps logged
  before the kill are the same on an idle and a loaded machine.
- `nan@N`         the loss of step N becomes NaN (a poisoned batch).
- `spike@N`       the loss of step N is multiplied by 50 (an outlier batch).
- `hang@N`        step N sleeps forever in the forward pass (for the hang watchdog).
- `bitflip@N`     flip a low mantissa bit (bit 12) of one weight during step N only: silent
                  corruption that one process cannot see (no NaN, no spike; the drill matrix
                  says so).
- `bitflip@N:exponent`  the same with the top exponent bit (bit 30): the weight becomes
                  ~1e37, the loss NaN or inf; loud, and the rerun tells hardware from data.
- `slow@N`        step N and later sleep 0.2 s each (a straggler).
- `slowdata@N`    the data phase of step N and later sleeps 0.5 s each (a stalled loader).
- `collapse@N`    from step N on, every MoE layer routes every token to expert 0 (a collapsed
                  router).

Multi-process runs: a `/rR` suffix limits an item to rank R (`RANK` of torchrun), and items
without one apply to every rank. Three faults are meant for one rank:
- `bitflip@N/rR`  after step N's update, flip a low mantissa bit of one weight on rank R and
                  leave it: the replicas diverge silently (the replica check, H201).
- `slow@N/rR`     from step N on, rank R burns 0.2 s of CPU time in each forward pass: a slow
                  chip computes slower, it does not sleep (the straggler monitor, H202).
- `sleep@N/rR`    rank R sleeps 600 s in step N's forward pass while the others wait in the
                  gradient all-reduce (the hung-rank diagnosis, R301).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from trainguard.errors import BadInputError

WRITE_KILL_WAIT_S = 120.0  # kill@N:checkpoint_write: how long step N + 1 waits for the write
ENV_VAR = "TRAINGUARD_INJECT"
KNOWN = {"kill", "nan", "spike", "hang", "bitflip", "slow", "sleep", "slowdata", "collapse"}
SLEEP_S = 600.0  # `sleep@N`: long enough for any collective timeout to notice
SLOW_DATA_S = 0.5  # `slowdata@N`: many times a tiny model's step, even on a loaded machine
# float32 bits: 31 sign, 30-23 exponent, 22-0 mantissa. Bit 12 changes a weight by about
# 2^-11 of itself (inside the loss noise); bit 30, the exponent's top bit, by a factor 2^128.
MANTISSA_BIT, EXPONENT_BIT = 12, 30


@dataclass
class FaultPlan:
    kills: dict[int, str] = field(default_factory=dict)
    nan_steps: set[int] = field(default_factory=set)
    spike_steps: set[int] = field(default_factory=set)
    hang_steps: set[int] = field(default_factory=set)
    bitflip_steps: dict[int, int] = field(default_factory=dict)
    """step -> the bit of the float32 weight flipped during that step (12 or 30)."""
    slow_from: int | None = None
    slow_data_from: int | None = None
    collapse_from: int | None = None
    # Rank-targeted faults (a `/rR` item on this process's rank): see the module docstring.
    replica_bitflip_steps: set[int] = field(default_factory=set)
    burn_from: int | None = None
    sleep_steps: set[int] = field(default_factory=set)
    fired: set[str] = field(default_factory=set)
    rank: int = 0  # this process's (the writer of a non-sharded checkpoint is rank 0)
    poisoned: dict[int, str] = field(default_factory=dict)
    settle_writes: Callable[[], object] | None = None
    """Set by the run's loop: waits for a checkpoint being written in the background. A kill
    in a training phase waits for it first, so that a drill's outcome (which checkpoint the
    relaunch resumes from) does not depend on how fast the disk is; `kill@N:checkpoint_write`
    is the fault that strikes a write."""
    settle_copy: Callable[[], object] | None = None
    """Set by the run's loop: waits for the background copy of the previous checkpoint's
    weights (`Checkpointer.wait_copied`). `bitflip@N` changes a weight during step N's forward
    and backward, which the copy otherwise runs beside: the flip waits for it first, or the
    previous checkpoint would hold the flipped bit."""

    @classmethod
    def parse(cls, text: str | None, rank: int | None = None) -> FaultPlan:
        """`rank`: this process's rank (default: `RANK` from the environment, else 0)."""
        rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        plan = cls(rank=rank)
        for item in filter(None, (t.strip() for t in (text or "").split(","))):
            body, _, target = item.partition("/")
            name, _, where = body.partition("@")
            step_text, _, phase = where.partition(":")
            bad_target = bool(target) and not (target[:1] == "r" and target[1:].isdigit())
            if name not in KNOWN or not step_text.isdigit() or bad_target:
                raise BadInputError(
                    f"cannot parse fault {item!r} in {ENV_VAR}",
                    f"use fault@step[:phase][/rRANK] with fault one of {sorted(KNOWN)}, "
                    "e.g. kill@7:backward or slow@5/r1",
                )
            if target and int(target[1:]) != rank:
                continue  # another rank's fault
            step = int(step_text)
            if target and name in ("bitflip", "slow"):
                if name == "bitflip":
                    plan.replica_bitflip_steps.add(step)
                else:
                    plan.burn_from = step
            elif name == "sleep":
                plan.sleep_steps.add(step)
            elif name == "kill":
                plan.kills[step] = phase or "forward"
            elif name == "nan":
                plan.nan_steps.add(step)
            elif name == "spike":
                plan.spike_steps.add(step)
            elif name == "hang":
                plan.hang_steps.add(step)
            elif name == "bitflip":
                if phase not in ("", "mantissa", "exponent"):
                    raise BadInputError(
                        f"cannot parse fault {item!r} in {ENV_VAR}: a bit flip is in the "
                        "mantissa (the default) or the exponent",
                        "use bitflip@N (a low mantissa bit) or bitflip@N:exponent",
                    )
                plan.bitflip_steps[step] = EXPONENT_BIT if phase == "exponent" else MANTISSA_BIT
            elif name == "slow":
                plan.slow_from = step
            elif name == "slowdata":
                plan.slow_data_from = step
            elif name == "collapse":
                plan.collapse_from = step
        return plan

    @classmethod
    def from_env(cls) -> FaultPlan:
        return cls.parse(os.environ.get(ENV_VAR))

    @property
    def active(self) -> bool:
        return (
            bool(self.kills or self.nan_steps or self.spike_steps or self.hang_steps)
            or bool(self.bitflip_steps)
            or self.slow_from is not None
            or self.slow_data_from is not None
            or self.collapse_from is not None
            or bool(self.replica_bitflip_steps or self.sleep_steps)
            or self.burn_from is not None
        )

    def at(self, phase: str, step: int) -> None:
        """Step `step` (0-based) enters `phase`."""
        if phase == "data" and self.rank == 0 and self.kills.get(step - 1) == "checkpoint_write":
            # The write of the checkpoint saved after step - 1 runs in rank 0's writer thread,
            # which kills this process from there; the loop waits for it rather than race
            # ahead (the other ranks go on: they hear of no write, and name rank 0 dead).
            time.sleep(WRITE_KILL_WAIT_S)  # only returns when the write never came (skipped)
        if self.kills.get(step) == phase:
            if self.settle_writes is not None and phase != "checkpoint_write":
                with contextlib.suppress(Exception):  # a failed write: the kill comes anyway
                    self.settle_writes()
            os.kill(os.getpid(), signal.SIGKILL)
        if phase == "forward" and step in self.hang_steps:
            while True:  # a hang: only the watchdog gets us out
                time.sleep(1.0)
        if phase == "forward" and self.slow_from is not None and step >= self.slow_from:
            time.sleep(0.2)
        if phase == "data" and self.slow_data_from is not None and step >= self.slow_data_from:
            time.sleep(SLOW_DATA_S)
        if phase == "forward" and self.burn_from is not None and step >= self.burn_from:
            end = time.thread_time() + 0.2
            while time.thread_time() < end:  # busy: a slow chip, not an idle one
                pass
        if phase == "forward" and step in self.sleep_steps and f"sleep@{step}" not in self.fired:
            self.fired.add(f"sleep@{step}")
            time.sleep(SLEEP_S)

    def collapse_router(self, step: int, model: torch.nn.Module) -> None:
        """`collapse@N`: from step N on, every MoE layer sends every token to expert 0."""
        if self.collapse_from is None or step < self.collapse_from:
            return
        for module in model.modules():
            if hasattr(module, "forced_expert"):
                module.forced_expert = 0

    def corrupt_replica(self, step: int, model: torch.nn.Module) -> bool:
        """`bitflip@N/rR`: after step N's update, flip bit 12 of one weight's mantissa on this
        rank and leave it. Small enough to leave the loss unremarkable, so only a comparison
        of the replicas can see it. True when it flipped."""
        key = f"replica_bitflip@{step}"
        if step not in self.replica_bitflip_steps or key in self.fired:
            return False
        self.fired.add(key)
        weight = next(p for p in model.parameters() if p.dim() == 2 and p.dtype == torch.float32)
        with torch.no_grad():
            weight.data.view(torch.int32).view(-1)[0] ^= 1 << MANTISSA_BIT
        return True

    def corrupt_loss(self, step: int, position: int, loss: torch.Tensor) -> torch.Tensor:
        """A poisoned (NaN) or outlier (x50) batch.

        The fault belongs to the batch, not the step: the batch first seen at step N is bad
        every time it is computed, as a real bad batch would be, so a rerun reproduces it
        (data, not hardware) and a rollback that skips its positions gets past it.
        """
        if step in self.nan_steps and f"nan@{step}" not in self.fired:
            self.fired.add(f"nan@{step}")
            self.poisoned[position] = "nan"
        if step in self.spike_steps and f"spike@{step}" not in self.fired:
            self.fired.add(f"spike@{step}")
            self.poisoned[position] = "spike"
        kind = self.poisoned.get(position)
        if kind == "nan":
            return loss * float("nan")
        if kind == "spike":
            return loss * 50.0
        return loss

    @contextlib.contextmanager
    def transient_bitflip(self, step: int, model: torch.nn.Module) -> Iterator[None]:
        """Data corruption during step N: one bit of one weight is flipped for the forward and
        backward of that step only, then restored, as a glitching ALU or memory read would do.
        A recomputation of the step sees the clean weight (once only). A low mantissa bit
        (the default) leaves the loss unremarkable; the exponent bit makes it NaN or inf."""
        key = f"bitflip@{step}"
        if step not in self.bitflip_steps or key in self.fired:
            yield
            return
        self.fired.add(key)
        if self.settle_copy is not None:
            self.settle_copy()
        flip = 1 << self.bitflip_steps[step]
        bits = _read_by_every_token(model).data.view(torch.int32).view(-1)
        with torch.no_grad():
            bits[0] ^= flip
        try:
            yield
        finally:
            with torch.no_grad():
                bits[0] ^= flip


def _read_by_every_token(model: torch.nn.Module) -> torch.Tensor:
    """The first linear layer's weight: every token's computation reads it. (An embedding row
    is read only when its token occurs, so a flip there can stay latent and the drill would
    test nothing.)"""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32:
            return m.weight
    return next(p for p in model.parameters() if p.dim() == 2 and p.dtype == torch.float32)
