"""`Guard`: the in-run detectors and their actions in any PyTorch loop, through one protocol.

    j = guard.judge(step, loss=loss, model=model, optimizer=optimizer)   # before the update
    done = guard.settle(j, rerun=recompute, checkpointer=ckpt, state=state, sampler=sampler)
    if done.rolled_back_to is not None: ...   # sampler.set_step(it), a new iterator, continue
    j.optimizer_step(optimizer)               # applied, skipped or masked, as judged
    end = guard.after_update(step, model, optimizer, checkpoint_due=saving)
    done = guard.settle(end, checkpointer=ckpt, state=state, sampler=sampler)  # H201: as above

- `judge` (before the update): the host path reads the metrics and decides now
  (`Judgement.decision`); the device path (`guards.decide_on`: CUDA by default) decides the
  skip on the device with no host read (`Judgement.ok` masks the update) and carries the
  previous step's decision, read back now (`Judgement.resolved`). `Judgement.known` is the one
  the loop can act on now.
- `after_update`: the multi-process checks (replicas H201, stragglers H202, the monitored
  barrier R301); with `checkpoint_due` it also reads the pending device step back.
- `settle`: acts on a decision in one place (guard/settle.py): the rerun that tells hardware
  (R205) from data (R206), the rollback (`Guard.rollback`), the halt (RunHalted).

The parts stay public: `step` (the host path's judgement), `step_async` (the device path's),
`flush` (the pending step read back), `end_step` (`after_update` without the read-back). Steps
count from 0. What the guard writes: guard/logs.py; actions per code: policy.py;
`distributed=True` adds the multi-process guards (guard/distributed/).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.errors import ConfigError
from trainguard.findings import Finding
from trainguard.goodput.loop_timing import LoopTiming
from trainguard.guard.arguments import actions_arg, device_of, guards_config, metric_float, sharded
from trainguard.guard.clock import StepClock
from trainguard.guard.config import ACTIONS, Action, GuardsConfig
from trainguard.guard.decision import Decision
from trainguard.guard.detectors.loader import LoaderStallDetector
from trainguard.guard.detectors.moe import MoEHealthDetector, RouterStats, router_summary
from trainguard.guard.detectors.monitor_set import DEFAULT_METRICS, MetricKind, MonitorSet
from trainguard.guard.judgement import Judgement, Settled
from trainguard.guard.logs import close_logs, log_findings, log_step
from trainguard.guard.policy import DEFAULT_ACTIONS, decide, decides_on_device
from trainguard.guard.rerun import classify_rerun
from trainguard.guard.rollback import rollback
from trainguard.guard.settle import Rerun, merged, settle
from trainguard.guard.state import guard_state, load_guard_state, take_windows
from trainguard.metrics.jsonl import MetricsLog
from trainguard.metrics.record import RecordWriter
from trainguard.metrics.sinks import MetricsFanout, MetricsSink

if TYPE_CHECKING:  # imported when a Guard is made distributed (torch.distributed)
    from trainguard.config.distributed import DistributedConfig
    from trainguard.guard.device import Staged
    from trainguard.guard.distributed.guards import DistributedGuards

__all__ = ["DEFAULT_ACTIONS", "Guard", "Judgement", "Settled", "grad_norm_of"]


def grad_norm_of(model: Any) -> float:
    """The global L2 norm of the model's gradients (parameters without gradients ignored)."""
    from trainguard.guard.device import grad_norm_tensor

    norm = grad_norm_tensor(model)
    return 0.0 if norm is None else float(norm.item())  # deliberate host sync


class Guard:
    """Runs the detectors every step and turns their findings into an action."""

    def __init__(
        self,
        run_dir: str | Path | None = None,
        actions: dict[str, Action] | None = None,
        config: GuardsConfig | dict[str, Any] | None = None,
        metrics: dict[str, MetricKind] | None = None,
        data_period: float | None = None,
        tensorboard_dir: str | Path | None = None,
        sinks: list[MetricsSink] | None = None,
        distributed: bool | DistributedConfig | DistributedGuards = False,
    ) -> None:
        """`run_dir`: findings go to `run_dir/guard.jsonl`, and the run record (every step's
        row, findings, rollbacks: `run_dir/metrics.jsonl`, `run_dir/run.json`) is written
        through `guard.record`. `tensorboard_dir`: every step's
        metrics and findings go to TensorBoard (the `tensorboard` extra); `sinks`: to any
        other `MetricsSink` (e.g. `trainguard.metrics.wandb_sink.WandbSink`). `config`: a
        `GuardsConfig` or a dict of its fields (the recipe's `guards` section)."""
        self.config = guards_config(config)
        self.actions: dict[str, Action] = {**DEFAULT_ACTIONS, **self.config.actions}
        for code, act in actions_arg(actions).items():
            if act not in ACTIONS:
                raise ConfigError(f"action {act!r} for {code}", f"use one of {ACTIONS}")
            self.actions[code] = act
        self.run_dir = Path(run_dir) if run_dir is not None else None
        viewers = list(sinks or [])
        if tensorboard_dir is not None:
            from trainguard.metrics.tensorboard_sink import TensorBoardSink

            viewers.append(TensorBoardSink(tensorboard_dir))
        # The same fan-out `run` writes through: rows of metrics.jsonl's shape to each sink.
        self.sinks = MetricsFanout(None, viewers)
        self._findings_log = MetricsLog(self.run_dir, "guard.jsonl") if self.run_dir else None
        # The run record (docs/run-record.md; `guard.record.attach(...)` adds what the guard
        # cannot see); its rows go through `timing`, which adds goodput's (guard/logs.py).
        self.record = RecordWriter(self.run_dir) if self.run_dir else None
        self.timing = LoopTiming(self.record) if self.record is not None else None
        self.monitors = MonitorSet(self.config, metrics or DEFAULT_METRICS, data_period)
        self.moe = MoEHealthDetector(self.config)  # R601-R604, from `router_stats`
        self.loader = LoaderStallDetector(self.config)  # R605, from the data phase's time
        self.clock = StepClock()  # each step's seconds and its data phase's (R605)
        self._pending_router: RouterStats | Callable[[], RouterStats] | None = None
        self.rollbacks = 0
        self.skipped = 0
        self.recent_bad: deque[int] = deque()
        self.history: list[dict[str, Any]] = []  # actions taken: auditable skip/rollback record
        self.pending_rollback: Decision | None = None  # what `rollback()` acts on
        self._pending: tuple[Judgement, Staged] | None = None  # step_async's, read at flush
        self.last_model: Any = None  # the model judged last: its gradients kept over a rerun
        self.distributed: DistributedGuards | None = None
        if distributed is not False:  # torch.distributed: imported only then
            from trainguard.guard.distributed.part import distributed_part

            self.distributed = distributed_part(distributed, self)

    # --- the protocol: judge, the update, after_update, settle ----------------------------------
    def judge(
        self,
        step: int,
        *,
        loss: Any = None,
        grad_norm: Any = None,
        model: Any = None,
        optimizer: Any = None,
        on_host: bool = False,
        **metrics: Any,
    ) -> Judgement:
        """Judge step `step` before its update, on the host or the device (`on_device`; the
        host with `on_host=True`, e.g. under fp16's GradScaler, or for DTensor (sharded)
        models). `metrics`: as `step` takes them. Without `grad_norm`: the norm of `model`'s
        gradients (give the pre-clip norm). Then `settle(judgement, ...)` and
        `judgement.optimizer_step(optimizer)`."""
        self.last_model = model
        device = device_of(loss, grad_norm, model=model)
        if not on_host and self.on_device(device) and not sharded(loss, grad_norm, model=model):
            return self.step_async(step, loss=loss, grad_norm=grad_norm, model=model, **metrics)
        decision = self.step(
            step, loss=loss, grad_norm=grad_norm, model=model, optimizer=optimizer, **metrics
        )
        return Judgement(step, decision=decision, model=model)

    def after_update(
        self, step: int, model: Any = None, optimizer: Any = None, *, checkpoint_due: bool = False
    ) -> Decision:
        """After the update of step `step`, on every rank: `end_step`. With `checkpoint_due`
        (a checkpoint, an evaluation or the end follows) the pending device step is read back
        first and comes back merged with the replicas' decision, so that nothing unsettled is
        saved; a rollback or halt read back is returned at once (the weights go back anyway)."""
        flushed = self.flush() if checkpoint_due else None
        if flushed is not None and flushed.action in ("rollback", "halt"):
            return flushed
        end = self.end_step(step, model, optimizer, checkpoint_due=checkpoint_due)
        if flushed is None:
            return end
        return merged(flushed, end)

    def settle(
        self,
        what: Judgement | Decision | None,
        *,
        rerun: Rerun | None = None,
        checkpointer: Any = None,
        state: dict[str, Any] | None = None,
        sampler: Any = None,
        defer: bool = False,
    ) -> Settled:
        """Act on a Judgement's `known` decision, or on `after_update`'s or `flush`'s:
        `rerun(step) -> (loss, grad_norm)`, step `step` recomputed on the same batch, when the
        guard asks (R205 hardware, R206 data); a rollback with `checkpointer`, `state` and
        `sampler` (`Settled.rolled_back_to`); a halt raises RunHalted. `defer=True`: rollback
        and halt left to the caller (`Settled.stop`). See guard/settle.py."""
        return settle(
            self, what, rerun=rerun, checkpointer=checkpointer, state=state, sampler=sampler,
            defer=defer,
        )  # fmt: skip

    # --- the two paths of `judge` ---------------------------------------------------------------
    def step(
        self,
        step: int,
        loss: Any = None,
        grad_norm: Any = None,
        tokens_per_s: float | None = None,
        model: Any = None,
        optimizer: Any = None,
        *,
        router_stats: RouterStats | None = None,
        data_time_s: float | None = None,
        step_time_s: float | None = None,
        **metrics: Any,
    ) -> Decision:
        """The host path of `judge` (`judge(..., on_host=True).decision`), before the update.
        `loss`/`grad_norm` may be tensors (one host sync each). With `optimizer`, gradients are
        cleared when the update must not be applied, so even an unconditional
        `optimizer.step()` changes nothing. `router_stats`: this step's MoE router counts,
        `trainguard.collect_router_stats(model, reset=True)` (R601-R604; summed over the ranks
        first). `data_time_s`: the seconds this step spent getting its batch (R605; default:
        the time inside `guard.phase("data", step)`); `step_time_s`: the step's seconds
        (default: the time since the last judged step)."""
        if not self.config.enabled:
            self.clock.times(data_time_s, step_time_s)  # keep the step clock going
            return Decision(step)
        self._refuse_if_pending("step")
        if self.record is not None and optimizer is not None:
            self.record.optimizer = optimizer  # its learning rate in the step rows
        if grad_norm is None and model is not None:
            grad_norm = grad_norm_of(model)
        values: dict[str, float | None] = {
            "loss": metric_float("loss", loss),
            "grad_norm": metric_float("grad_norm", grad_norm),
            "tokens_per_s": metric_float("tokens_per_s", tokens_per_s),
        }
        for k, v in metrics.items():
            values[k] = metric_float(k, v)
        values |= self.clock.times(data_time_s, step_time_s)
        if router_stats:
            values |= router_summary(router_stats)
        decision = self._judge(step, values, router_stats)
        if decision.action != "apply" and optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        return decision

    def _judge(
        self, step: int, values: dict[str, float | None], router_stats: RouterStats | None = None
    ) -> Decision:
        """Detectors -> findings -> action, and the record of both (either path)."""
        if self.distributed is not None:
            values = self.distributed.agree(step, values)  # the same decision on every rank
        found = self.monitors.update(step, values)
        found += self.moe.update(step, router_stats)
        found += self.loader.update(step, values.get("data_time_s"), values.get("step_time_s"))
        decision = decide(self, step, found) if found else Decision(step)
        decision.values = values
        self._log(step, values, decision, router_stats)
        return decision

    # --- the device path: no host sync in the step ---------------------------------------------
    def step_async(
        self,
        step: int,
        loss: Any = None,
        grad_norm: Any = None,
        tokens_per_s: float | None = None,
        model: Any = None,
        *,
        router_stats: RouterStats | Callable[[], RouterStats] | None = None,
        data_time_s: float | None = None,
        step_time_s: float | None = None,
        **metrics: Any,
    ) -> Judgement:
        """The device path of `judge` (guard/device.py): the skip of a non-finite or spiking
        step decided and masked on the device exactly as `step` decides it; findings, logs,
        escalations (R204, R203) and divergence (R104) come one step later (`resolved` of the
        next call, or `flush()`), before the next update. Needs every skip-action code among
        R101-R103 (ConfigError otherwise): a skip decided from the history alone cannot veto
        the update it arrives after."""
        from trainguard.guard.device import judge_async

        if not self.config.enabled:
            return Judgement(step, None, model=model)
        values = {"loss": loss, "grad_norm": grad_norm, "tokens_per_s": tokens_per_s, **metrics}
        times = self.clock.times(data_time_s, step_time_s)
        return judge_async(self, step, values, model, router_stats, times)

    @property
    def pending_step(self) -> int | None:
        """The step `step_async` judged whose decision is not read back yet; None when none
        (every earlier step's action is in `history`)."""
        return None if self._pending is None else self._pending[0].step

    def flush(self) -> Decision | None:
        """The pending step's decision read back now (one host read), or None: before a
        checkpoint, an evaluation, the end; `settle` it."""
        from trainguard.guard.device import flush

        return flush(self)

    def on_device(self, device: Any) -> bool:
        """Whether a step on `device` is judged on the device (`decide_on`, policy.py)."""
        return decides_on_device(self, device)

    def _refuse_if_pending(self, what: str) -> None:
        if self._pending is not None:
            raise RuntimeError(
                f"guard.{what} with step {self._pending[0].step} still pending from "
                "step_async: call guard.flush() first and act on its decision"
            )

    # --- the multi-process guards ---------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str, step: int) -> Iterator[None]:
        """Mark a phase of the step (data, forward, backward, optimizer) for the straggler
        timings; a collective that fails inside names the hung ranks and exits 3. The "data"
        phase is timed in every loop, one process or many: its share of the step is watched
        for loader stalls (R605, see `step`)."""
        t0 = time.perf_counter()
        try:
            if self.distributed is None:
                yield
            else:
                with self.distributed.phase(name, step):
                    yield
        finally:
            if name == "data":  # R605 in any loop, one process or many
                self.clock.add_data(time.perf_counter() - t0)
            elif self.timing is not None:  # a save's stall, an evaluation: goodput's rows
                self.timing.phase(name, step, time.perf_counter() - t0)

    def end_step(
        self, step: int, model: Any = None, optimizer: Any = None, *, checkpoint_due: bool = False
    ) -> Decision:
        """`after_update` without reading back a pending device step. After the update of step
        `step`, on every rank: the replica check every K steps and
        when `checkpoint_due` (call it before saving: a corrupt replica is never saved), the
        straggler ranking, the monitored barrier. H201 asks for a rollback (no batches to skip:
        the data is not at fault), or a halt after more than `max_rollbacks` of them; H202 is
        reported. A hung rank never returns here: the ranks write hang reports and exit 3."""
        if self.distributed is None:
            return Decision(step)
        d = self.distributed.end_step(step, model, optimizer, checkpoint_due=checkpoint_due)
        if d.action == "rollback":
            self.pending_rollback = d
        if d.action != "apply":
            self.history.append({"step": step, "action": d.action, "bad_steps": []})
        self._log_findings(d.findings)
        return d

    def rollback(self, checkpointer: Any, state: dict[str, Any], sampler: Any) -> int:
        """Act on a rollback decision: restore the last verified checkpoint into `state`
        through `checkpointer.load_latest`, make `sampler` skip the samples of the decision's
        bad steps (recorded in its state), keep this guard's counters and the sampler's earlier
        skips across the restore. Returns the step to continue from; then `sampler.set_step`
        it and build a new iterator. Raises RunHalted when there is no
        checkpoint (one text for every loop)."""
        return rollback(self, checkpointer, state, sampler)

    def classify_rerun(self, first: Any, second: Any, step: int | None = None) -> Finding:
        """R205 (hardware) or R206 (data): what a rerun of the step gave (guard/rerun.py)."""
        return classify_rerun(first, second, rtol=self.config.rerun_rtol, step=step)

    # --- state (guard/state.py) ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self._refuse_if_pending("state_dict")  # its values are not in the windows yet
        return guard_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: restore the windows and the action counters. ConfigError when `state` is
        not what `state_dict()` returned; the guard is then left as it was."""
        load_guard_state(self, state)

    def after_rollback(self, checkpoint_state: dict[str, Any] | None) -> None:
        """The loop restored a checkpoint: take its monitor windows, keep the action counters
        (or the rollback limit could never be reached)."""
        take_windows(self, checkpoint_state)

    # --- the record (guard/logs.py) ----------------------------------------------------------
    def _log(
        self,
        step: int,
        values: dict[str, float | None],
        decision: Decision,
        router_stats: RouterStats | None = None,
    ) -> None:
        log_step(self, step, values, decision, router_stats)

    def report(self, findings: list[Finding]) -> None:
        """Record findings made outside the detectors (a checkpoint that failed verification
        on resume) where the guard's own go: guard.jsonl, the run record and every sink."""
        log_findings(self, findings)

    def _log_findings(self, findings: list[Finding]) -> None:
        log_findings(self, findings)

    def close(self) -> None:
        """Flush and close guard.jsonl and the metric sinks; disarm the distributed part's
        SIGTERM stack dump."""
        close_logs(self)
        if self.distributed is not None:
            self.distributed.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
