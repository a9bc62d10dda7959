"""`Guard`: the in-run detectors and their actions in any PyTorch loop.

    guard = trainguard.Guard(run_dir="runs/x", distributed=True)   # under torchrun
    step = checkpointer.load_latest(state) or 0
    sampler.set_step(step); batches = iter(loader)
    while step < max_steps:
        loss = model(next(batches)); loss.backward()
        decision = guard.step(step, loss=loss, model=model, optimizer=optimizer)
        if decision.action == "rollback":   # restore, skip decision.bad_steps, new iterator
            step = guard.rollback(checkpointer, state, sampler)
            sampler.set_step(step); batches = iter(loader)
            continue
        decision.raise_if_halt()
        if decision.apply:
            optimizer.step()                # only after the guard saw this update
        optimizer.zero_grad()
        end = guard.end_step(step, model=model, optimizer=optimizer)  # replicas, stragglers
        ...                                 # end.action "rollback" (H201): as above
        step += 1
        ...                                 # checkpointer.save(step, state) when due

Steps count from 0, as the sampler and the checkpointer count them (`step` = the updates done
before this one). Call `guard.step` BEFORE `optimizer.step()`: a non-finite or spiking update
is then never applied. `Guard(tensorboard_dir="runs/x/tb")` (or `sinks=[...]`, any
`MetricsSink`) also sends each step's metrics and every finding there, as `trainguard run`
does; call `guard.close()` at the end (or use the guard as a context manager). The action for
each finding code is configurable (`actions={"R102": "apply"}`); the strongest action among the
step's findings wins (halt > rollback > skip > apply).

`distributed=True` (or a `DistributedConfig`, or a `guards.DistributedGuards`) adds the
multi-process guards: `guard.step` averages the metrics over the ranks so that every rank takes
the same decision, `guard.phase(name, step)` times phases (stragglers) and turns a failed
collective into the hung-rank diagnosis, and `guard.end_step` compares replicas (H201: a
rollback), ranks stragglers (H202) and meets at the monitored barrier (R301: exit 3).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.errors import ConfigError
from trainguard.findings import Finding
from trainguard.guard.arguments import actions_arg, guards_config, metric_arg, state_arg
from trainguard.guard.config import ACTIONS, Action, GuardsConfig
from trainguard.guard.decision import DEVICE_CODES, STRENGTH, Decision
from trainguard.guard.detectors.loader import LoaderStallDetector
from trainguard.guard.detectors.moe import MoEHealthDetector, RouterStats, router_summary
from trainguard.guard.detectors.monitor_set import DEFAULT_METRICS, MetricKind, MonitorSet
from trainguard.guard.rerun import classify_rerun
from trainguard.guard.rollback import checkpointer_findings, restore
from trainguard.metrics.jsonl import MetricsLog
from trainguard.metrics.record import RecordWriter
from trainguard.metrics.sinks import MetricsFanout, MetricsSink

if TYPE_CHECKING:  # imported when a Guard is made distributed (torch.distributed)
    from trainguard.config.distributed import DistributedConfig
    from trainguard.guard.device import PendingStep, Staged
    from trainguard.guard.distributed.guards import DistributedGuards

__all__ = ["Guard", "grad_norm_of"]

DEFAULT_ACTIONS: dict[str, Action] = {
    "R101": "skip",  # non-finite loss / grad norm
    "R102": "skip",  # loss spike
    "R103": "skip",  # grad-norm spike
    "R104": "rollback",  # divergence
    "R105": "apply",  # oscillation: a data-order problem, nothing to undo in-run
    "R106": "apply",  # throughput drop: report only
    "R204": "rollback",  # repeated bad steps
}


def _to_float(name: str, x: Any) -> float | None:
    x = metric_arg(name, x)  # ConfigError naming `name` for a string, a 3-element tensor ...
    if hasattr(x, "detach"):
        return float(x.detach().float().cpu().item())  # deliberate host sync: one per metric
    return x


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
        # The run record (metrics.jsonl + run.json, docs/run-record.md): `guard.record.attach(
        # sampler=..., config=..., checkpoints=...)` adds what the guard cannot see.
        self.record = RecordWriter(self.run_dir) if self.run_dir else None
        self.monitors = MonitorSet(self.config, metrics or DEFAULT_METRICS, data_period)
        self.moe = MoEHealthDetector(self.config)  # R601-R604, from `router_stats`
        self.loader = LoaderStallDetector(self.config)  # R605, from the data phase's time
        self._data_time = 0.0  # seconds in `phase("data")` since the last `step`
        self._timed_data = False
        self._last_step_at: float | None = None
        self._pending_router: RouterStats | Callable[[], RouterStats] | None = None
        self.rollbacks = 0
        self.skipped = 0
        self.recent_bad: deque[int] = deque()
        self.history: list[dict[str, Any]] = []  # actions taken: auditable skip/rollback record
        self.pending_rollback: Decision | None = None  # what `rollback()` acts on
        self._pending: tuple[PendingStep, Staged] | None = None  # step_async's, read at flush
        self.distributed = self._distributed_part(distributed)

    def _distributed_part(
        self, distributed: bool | DistributedConfig | DistributedGuards
    ) -> DistributedGuards | None:
        if distributed is False:
            return None
        from trainguard.config.distributed import DistributedConfig
        from trainguard.guard.distributed.guards import DistributedGuards

        if isinstance(distributed, DistributedGuards):
            return distributed  # built by the caller (trainguard run does)
        config = distributed if isinstance(distributed, DistributedConfig) else None
        part = DistributedGuards(
            config,
            run_dir=self.run_dir,
            max_rollbacks=self.config.max_rollbacks,
            on_hang=lambda f: self._log_findings([f]),
        )
        part.start()  # ranks the launcher stops (a hung one among them) dump their stacks
        return part

    # --- the per-step call -------------------------------------------------------------------
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
        """Score this step's metrics; call before `optimizer.step()`.

        `loss`/`grad_norm` may be tensors (one host sync each; `step_async` has none). Without
        `grad_norm`, it is computed from `model`'s gradients. With `optimizer`, gradients are
        cleared when the update must not be applied, so even an unconditional
        `optimizer.step()` changes nothing (torch optimizers skip parameters without gradients).

        `router_stats`: this step's MoE router counts, `trainguard.collect_router_stats(model,
        reset=True)` (R601-R604; summed over the ranks in a multi-process loop, so that every
        rank judges the same counts). `data_time_s`: the seconds this step spent getting its
        batch (R605); without it, the time spent inside `with guard.phase("data", step):`
        since the last call. `step_time_s`: the step's seconds; without it, the time since
        the last `guard.step` call.
        """
        if not self.config.enabled:
            self._phase_times(data_time_s, step_time_s)  # keep the step clock going
            return Decision(step)
        self._refuse_if_pending("step")
        if self.record is not None and optimizer is not None:
            self.record.optimizer = optimizer  # its learning rate in the step rows
        if grad_norm is None and model is not None:
            grad_norm = grad_norm_of(model)
        values: dict[str, float | None] = {
            "loss": _to_float("loss", loss),
            "grad_norm": _to_float("grad_norm", grad_norm),
            "tokens_per_s": _to_float("tokens_per_s", tokens_per_s),
        }
        for k, v in metrics.items():
            values[k] = _to_float(k, v)
        values |= self._phase_times(data_time_s, step_time_s)
        if router_stats:
            values |= router_summary(router_stats)
        decision = self._judge(step, values, router_stats)
        if decision.action != "apply" and optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        return decision

    def _phase_times(self, data_time_s: Any, step_time_s: Any) -> dict[str, float | None]:
        """This step's data-phase and step seconds (R605): as given, else what
        `phase("data")` timed since the last call and the time since the last call."""
        now = time.perf_counter()
        if data_time_s is None and self._timed_data:
            data_time_s = self._data_time
        if step_time_s is None and self._last_step_at is not None:
            step_time_s = now - self._last_step_at
        self._last_step_at, self._data_time, self._timed_data = now, 0.0, False
        if data_time_s is None:
            return {}
        return {
            "data_time_s": _to_float("data_time_s", data_time_s),
            "step_time_s": _to_float("step_time_s", step_time_s),
        }

    def _judge(
        self, step: int, values: dict[str, float | None], router_stats: RouterStats | None = None
    ) -> Decision:
        """Detectors -> findings -> action, and the record of both (either path)."""
        if self.distributed is not None:
            values = self.distributed.agree(step, values)  # the same decision on every rank
        found = self.monitors.update(step, values)
        found += self.moe.update(step, router_stats)
        found += self.loader.update(step, values.get("data_time_s"), values.get("step_time_s"))
        decision = self._decide(step, found) if found else Decision(step)
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
    ) -> PendingStep:
        """Judge this step on the device; do the previous step's bookkeeping (guard/device.py).

            pending = guard.step_async(step, loss=loss, model=model)  # loss: a device tensor
            earlier = pending.resolved       # the previous step's Decision, read back now
            if earlier is not None and earlier.action == "rollback":
                step = guard.rollback(checkpointer, state, sampler); ...; continue
            if earlier is not None:
                earlier.raise_if_halt()
            pending.optimizer_step(optimizer)  # applied only if the device let it through
            optimizer.zero_grad()
            ...
            last = guard.flush()             # before a checkpoint, an evaluation, the end

        The skip of a non-finite or spiking step is decided and applied on the device, exactly
        as `step` decides it; findings, logs, escalations (R204 rollback, R203 halt) and
        divergence (R104) come one step later, in `pending.resolved` of the next call or from
        `flush()`, before the next update. Call `flush()` before `state_dict()` (a checkpoint)
        and act on what it returns. `loss`/`grad_norm` as Python floats work too (no device
        work for them). Needs every skip-action code among R101-R103 (ConfigError otherwise):
        a skip decided from the history alone cannot veto the update it arrives after.
        """
        from trainguard.guard.device import PendingStep, grad_norm_tensor, judge

        if not self.config.enabled:
            return PendingStep(step, None)
        self._refuse_device_path()
        resolved = self.flush()
        if resolved is not None and resolved.action in ("rollback", "halt"):
            return PendingStep(step, None, resolved, dropped=True)
        if grad_norm is None and model is not None:
            grad_norm = grad_norm_tensor(model)
        values = {"loss": loss, "grad_norm": grad_norm, "tokens_per_s": tokens_per_s, **metrics}
        values = {k: metric_arg(k, v) for k, v in values.items()}  # shapes only: no sync
        values |= self._phase_times(data_time_s, step_time_s)  # R605 as in `step` (host floats)
        # R601-R604: the stats, or a function that reads them, called when the step is read back
        # (`flush`), so that the step itself never waits for the device.
        self._pending_router = router_stats
        ok, staged = judge(self, values)
        pending = PendingStep(step, ok, resolved)
        self._pending = (pending, staged)
        return pending

    @property
    def pending_step(self) -> int | None:
        """The step `step_async` judged whose decision is not read back yet; None when none
        (every earlier step's action is in `history`)."""
        return None if self._pending is None else self._pending[0].step

    def flush(self) -> Decision | None:
        """The pending step's bookkeeping now (one host read of its staged values): its
        Decision, or None when nothing is pending. A skipped update's host-side state is put
        back here (guard/masked_step.py), before anything can read it."""
        if self._pending is None:
            return None
        pending, staged = self._pending
        self._pending = None
        values, applied = staged.read()
        router, self._pending_router = self._pending_router, None
        router_stats = router() if callable(router) else router
        if router_stats:
            values |= router_summary(router_stats)
        decision = self._judge(pending.step, values, router_stats)
        vetoed = any(
            f.code in DEVICE_CODES and self.actions.get(f.code, "apply") != "apply"
            for f in decision.findings
        )
        if not applied and pending.repair is not None:
            pending.repair.undo()
        if vetoed == applied:  # the two evaluations of one formula disagree: never expected
            warnings.warn(
                f"step {pending.step}: the device {'applied' if applied else 'skipped'} the "
                f"update but the detectors say {decision.action}; the device's choice stands",
                RuntimeWarning,
                stacklevel=2,
            )
        return decision

    def on_device(self, device: Any) -> bool:
        """Whether a loop on `device` should call `step_async` (`config.decide_on`): always
        with "device", on CUDA with "auto" unless the ranks must agree on the metrics through
        the host (then `step`), never with "host" or a disabled guard."""
        c = self.config
        if not c.enabled or c.decide_on == "host":
            return False
        if c.decide_on == "device":
            return True
        part = self.distributed
        agrees = part is not None and part.active and part.agree_metrics
        return getattr(device, "type", str(device)) == "cuda" and not agrees

    def _refuse_device_path(self) -> None:
        late = sorted(c for c, a in self.actions.items() if a == "skip" and c not in DEVICE_CODES)
        if late and late != ["R204"]:
            raise ConfigError(
                f"guard.step_async decides skips on the device from R101-R103 only; "
                f"{', '.join(c for c in late if c != 'R204')} configured to skip needs the "
                "value on the host",
                "use guard.step for this configuration, or give those codes apply, rollback "
                "or halt",
            )
        part = self.distributed
        if part is not None and part.active and part.agree_metrics:
            raise ConfigError(
                "guard.step_async cannot average the metrics over the ranks without a host sync",
                "all-reduce the loss yourself (the gradient norm after DDP is already shared) "
                "and build the part with DistributedGuards(..., agree_metrics=False), or use "
                "guard.step",
            )

    def _refuse_if_pending(self, what: str) -> None:
        if self._pending is not None:
            raise RuntimeError(
                f"guard.{what} with step {self._pending[0].step} still pending from "
                "step_async: call guard.flush() first and act on its decision"
            )

    def _decide(self, step: int, found: list[Finding]) -> Decision:
        c = self.config
        action: Action = "apply"
        for f in found:
            a = self.actions.get(f.code, "apply")
            if STRENGTH[a] > STRENGTH[action]:
                action = a
        d = Decision(step, action, list(found))
        d.rerun = action != "apply" and any(f.code in c.rerun_on for f in found)
        if action == "skip":
            self.recent_bad.append(step)
        while self.recent_bad and self.recent_bad[0] <= step - c.repeat_window:
            self.recent_bad.popleft()
        if action == "skip" and len(self.recent_bad) >= c.repeat_count:
            d.findings.append(
                Finding.of(
                    "R204",
                    f"{len(self.recent_bad)} bad steps within {c.repeat_window} steps "
                    f"(steps {list(self.recent_bad)})",
                    step=step,
                    data={"steps": list(self.recent_bad)},
                )
            )
            a = self.actions.get("R204", "rollback")
            if STRENGTH[a] > STRENGTH[action]:
                action = a
        if action == "rollback" and self.rollbacks >= c.max_rollbacks:
            action = "halt"
            d.findings.append(
                Finding.of(
                    "R203",
                    f"a rollback was needed at step {step} but the run already rolled back "
                    f"{self.rollbacks} times (max_rollbacks={c.max_rollbacks})",
                    step=step,
                    data={"rollbacks": self.rollbacks, "max_rollbacks": c.max_rollbacks},
                )
            )
        elif action == "halt":
            codes = sorted({f.code for f in found if self.actions.get(f.code) == "halt"})
            d.findings.append(
                Finding.of("R203", f"findings {codes} are configured to halt the run", step=step)
            )
        elif action == "rollback":
            self.rollbacks += 1
            bad = sorted({*self.recent_bad, step, *self._divergent_steps(found, step)})
            d.bad_steps = bad
            self.pending_rollback = d
            self.recent_bad.clear()
            d.findings.append(
                Finding.of(
                    "R202",
                    f"roll back to the last good checkpoint and skip the batches of steps {bad} "
                    f"(rollback {self.rollbacks} of at most {c.max_rollbacks})",
                    step=step,
                    data={"bad_steps": bad, "rollbacks": self.rollbacks},
                )
            )
        elif action == "skip":
            self.skipped += 1
            d.findings.append(
                Finding.of(
                    "R201",
                    f"update of step {step} not applied ({', '.join(f.code for f in found)})",
                    step=step,
                    data={"codes": [f.code for f in found]},
                )
            )
        d.action = action
        if action != "apply":
            self.history.append({"step": step, "action": action, "bad_steps": d.bad_steps})
        return d

    @staticmethod
    def _divergent_steps(found: list[Finding], step: int) -> list[int]:
        for f in found:
            if f.code == "R104" and f.data.get("since_step") is not None:
                return list(range(int(f.data["since_step"]), step + 1))
        return []

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
                self._data_time += time.perf_counter() - t0
                self._timed_data = True

    def end_step(
        self, step: int, model: Any = None, optimizer: Any = None, *, checkpoint_due: bool = False
    ) -> Decision:
        """After the update of step `step`, on every rank: the replica check every K steps and
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
        it and build a new iterator. Raises RunHalted when there is no checkpoint."""
        decision = self.pending_rollback
        self.pending_rollback = None
        at = decision.step if decision is not None else -1
        bad = decision.bad_steps if decision is not None else []
        if self.distributed is None:
            step, event = restore(self, checkpointer, state, sampler, bad, at)
        else:  # the load's collectives get the checkpoint budget, not the step timeout
            with self.distributed.budget("checkpoint"):
                step, event = restore(self, checkpointer, state, sampler, bad, at)
        for log in (self._findings_log, self.record):  # the auditable record of the skips
            if log is not None:
                log.write({"kind": "event", "step": at, **event})
        self._log_findings(checkpointer_findings(checkpointer))
        return step

    # --- rerun to classify ---------------------------------------------------------------------
    def classify_rerun(self, first: Any, second: Any, step: int | None = None) -> Finding:
        return classify_rerun(first, second, rtol=self.config.rerun_rtol, step=step)

    # --- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self._refuse_if_pending("state_dict")  # its values are not in the windows yet
        state = {
            "version": 1,
            "monitors": self.monitors.state_dict(),
            "moe": self.moe.state_dict(),
            "loader": self.loader.state_dict(),
            "rollbacks": self.rollbacks,
            "skipped": self.skipped,
            "recent_bad": list(self.recent_bad),
            "history": list(self.history),
        }
        if self.distributed is not None:  # straggler windows, replica rollback count
            state["distributed"] = self.distributed.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: restore the windows and the action counters. ConfigError when `state` is
        not what `state_dict()` returned; the guard is then left as it was."""
        state = state_arg(state)
        try:  # into fresh parts first, so that a damaged state changes nothing
            monitors = MonitorSet(self.monitors.config, self.monitors.metrics)
            monitors.set_data_period(self._data_period())
            monitors.load_state_dict(state.get("monitors", {}))
            counters = (
                int(state.get("rollbacks", 0)),
                int(state.get("skipped", 0)),
                deque(int(s) for s in state.get("recent_bad", [])),
                list(state.get("history", [])),
            )
            moe, loader = self._health_parts(state)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise ConfigError(
                f"Guard.load_state_dict(state): state is not a Guard.state_dict() ({e!r:.120})",
                "pass the guard's state as saved in the checkpoint (state['guard'])",
            ) from None
        self.monitors, self.moe, self.loader = monitors, moe, loader
        self.rollbacks, self.skipped, self.recent_bad, self.history = counters
        if self.distributed is not None and "distributed" in state:
            self.distributed.load_state_dict(state["distributed"])

    def after_rollback(self, checkpoint_state: dict[str, Any] | None) -> None:
        """The loop restored a checkpoint: take its monitor windows, keep the action counters.

        The counters must survive, or the rollback limit could never be reached.
        """
        if checkpoint_state and "monitors" in checkpoint_state:
            fresh = MonitorSet(self.monitors.config, self.monitors.metrics)
            fresh.set_data_period(self._data_period())
            fresh.load_state_dict(checkpoint_state["monitors"])
            self.monitors = fresh
            self._load_health(checkpoint_state)
        self.recent_bad.clear()

    def _load_health(self, state: dict[str, Any]) -> None:
        self.moe, self.loader = self._health_parts(state)

    def _health_parts(
        self, state: Mapping[str, Any]
    ) -> tuple[MoEHealthDetector, LoaderStallDetector]:
        """The MoE and loader detectors with their state (absent in checkpoints from before
        them)."""
        moe = MoEHealthDetector(self.config)
        moe.load_state_dict(state.get("moe", {}))
        loader = LoaderStallDetector(self.config)
        if "loader" in state:
            loader.load_state_dict(state["loader"])
        return moe, loader

    def _data_period(self) -> float | None:
        from trainguard.guard.detectors.oscillation import OscillationDetector

        for m in self.monitors.monitors.values():
            if isinstance(m, OscillationDetector):
                return m.data_period
        return None

    def _log(
        self,
        step: int,
        values: dict[str, float | None],
        decision: Decision,
        router_stats: RouterStats | None = None,
    ) -> None:
        if self.record is not None:  # the values read in this step's one host sync: no more
            self.record.step(step, values, decision.action, router_stats)
        self._log_findings(decision.findings)
        if self.sinks.viewers:
            metrics = {k: v for k, v in values.items() if v is not None}
            self.sinks.write({"kind": "step", "step": step, **metrics, "action": decision.action})

    def report(self, findings: list[Finding]) -> None:
        """Record findings made outside the detectors (a checkpoint that failed verification
        on resume) where the guard's own go: guard.jsonl and every sink."""
        self._log_findings(findings)

    def _log_findings(self, findings: list[Finding]) -> None:
        """Findings to guard.jsonl and to every sink."""
        for row in ({"kind": "finding", **f.to_dict()} for f in findings):
            if self._findings_log is not None:
                self._findings_log.write(row)
            if self.record is not None:
                self.record.write(row)
            if self.sinks.viewers:
                self.sinks.write(row)

    def close(self) -> None:
        """Flush and close guard.jsonl and the metric sinks; disarm the distributed part's
        SIGTERM stack dump."""
        if self._findings_log is not None:
            self._findings_log.close()
        if self.record is not None:
            self.record.close()
        self.sinks.close()
        if self.distributed is not None:
            self.distributed.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
