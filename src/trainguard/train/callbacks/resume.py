"""How this process joins the run's history (`train/start.py` restored the checkpoint):

- a fresh start logs the `start` event with the environment;
- a resume drops the rows of the steps a crash threw away from the metric log (they are
  recomputed) and writes goodput's `attempt` row with what it dropped (goodput/rows.py; a
  fresh start writes one too), logs the hangs that ended earlier attempts (R210, R301, R302;
  once each), what the restore found (damaged steps passed over, junk in the folder),
  software drift (H101) and C150; then checks that every recomputed step reads the very
  batch the lost one had logged (D110: a replay that read other data would silently train on
  something else).
"""

from __future__ import annotations

from typing import Any

from trainguard.data.order import compare_batch_hashes
from trainguard.findings import Finding
from trainguard.goodput import rows as acc
from trainguard.train.callback import Callback, RunContext
from trainguard.train.start import unlogged_hang_reports
from trainguard.util.processes import process_started_at


class ResumeCallback(Callback):
    name = "resume"
    priority = 87  # after pre-flight and the run files, before any other callback writes rows

    def __init__(self, env: dict[str, Any]) -> None:
        self.env = env
        self.found: list[Finding] = []
        self.fresh = True
        self.replayed: dict[int, str] = {}  # step -> the batch hash the lost run logged

    def restored(self, found: list[Finding], fresh: bool) -> None:
        """What the restore found (and, resumed, H101 and C150); `fresh`: no checkpoint."""
        self.found, self.fresh = found, fresh

    def pre_train(self, ctx: RunContext) -> None:
        dropped = ctx.metrics.truncate_after(ctx.step) if ctx.is_main else []
        if ctx.is_main:  # this process joins: goodput's attempt row, with what the cut dropped
            resumed = ctx.step if ctx.step > 0 else None  # None: a fresh start
            start, launcher = process_started_at(), acc.launcher_started_at()
            ctx.metrics.write(acc.attempt_row(dropped, resumed, start, launcher))
        # A row without a hash (damaged, or not trainguard's) has nothing to compare with.
        self.replayed = {
            r["step"]: r["batch_hash"]
            for r in dropped
            if r.get("kind") == "step" and isinstance(r.get("batch_hash"), str)
        }
        if ctx.is_main:
            ctx.record(unlogged_hang_reports(ctx.run_dir))
        ctx.record(self.found)
        if self.fresh:
            ctx.log_event("start", env=self.env)

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        if step in self.replayed:
            expected = {step: self.replayed.pop(step)}
            ctx.record(compare_batch_hashes(expected, {step: row["batch_hash"]}))
