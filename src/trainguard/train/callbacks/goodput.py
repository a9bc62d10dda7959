"""The timing rows goodput accounting needs (`goodput/accounting.py`, docs/goodput.md): the start
of this process's first step, each checkpoint stall and evaluation, the checkpoint copy a step
waited for, each save's time to durable, and the end.

Rank 0 writes them to the metric log; the other ranks time nothing. The `attempt` row (when
this process started, what the resume's cut dropped) is the resume's (`ResumeCallback`): it
has the dropped rows in hand, so the log is read once per start.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trainguard.checkpoint.manifest import MANIFEST  # written last: when a save is durable
from trainguard.goodput import rows as acc
from trainguard.train.callback import Callback, RunContext

_TIMED = ("checkpoint", "eval")


class GoodputCallback(Callback):
    name = "goodput"
    priority = 86  # its pre_train only arms it; the order among the start's callbacks is free

    def __init__(self, checkpointer: Any = None) -> None:
        self.checkpointer = checkpointer  # its `copy_wait_s`: the stall inside a step
        self.open: tuple[str, float, float] | None = None  # phase, perf start, wall start
        self.copy_wait = 0.0
        self.saves: dict[int, float] = {}  # checkpoint step -> wall time its save began
        self.joined = False  # pre_train ran: a run refused before it writes nothing here
        self.stepped = False  # this process's first step is logged

    def pre_train(self, ctx: RunContext) -> None:
        self.joined = True
        self.copy_wait = getattr(self.checkpointer, "copy_wait_s", 0.0)

    def on_phase(self, ctx: RunContext, phase: str, step: int) -> None:
        if self.open is not None and self.open[0] != phase:
            self._close_phase(ctx)
        if self.open is None and phase in _TIMED:
            self.open = (phase, time.perf_counter(), time.time())
            if phase == "checkpoint":
                self.saves[ctx.step] = self.open[2]

    def pre_step(self, ctx: RunContext, step: int) -> None:
        self._close_phase(ctx)

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        if not self.stepped and ctx.is_main:
            self.stepped = True
            ctx.metrics.write(acc.first_step_row(row["time"] - row["step_time_s"]))
        waited = getattr(self.checkpointer, "copy_wait_s", 0.0)
        if waited > self.copy_wait and ctx.is_main:
            ctx.metrics.write(acc.copy_wait_row(step, waited - self.copy_wait))
        self.copy_wait = waited

    def post_checkpoint(self, ctx: RunContext, step: int, path: str) -> None:
        began = self.saves.pop(step, None)
        manifest = Path(path) / MANIFEST
        if began is None or not ctx.is_main or not manifest.is_file():  # a remote store
            return
        ctx.metrics.write(acc.write_row(step, max(0.0, manifest.stat().st_mtime - began)))

    def close(self, ctx: RunContext) -> None:
        if not self.joined:
            return
        self._close_phase(ctx)
        if ctx.is_main:
            ctx.metrics.write(acc.end_row(ctx.step, time.time()))

    def _close_phase(self, ctx: RunContext) -> None:
        if self.open is None:
            return
        phase, t0, _ = self.open
        self.open = None
        if ctx.is_main:
            ctx.metrics.write(acc.phase_row(phase, ctx.step, time.perf_counter() - t0, time.time()))
