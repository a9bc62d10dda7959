"""The guard's decision on the device, its bookkeeping one step later (`Guard.step_async`).

`Guard.step` reads every metric with `.item()`: a host sync per metric per step, which on a
GPU drains the launch queue before the optimizer kernels can be queued. In the spirit of
torchtitan's, the device path splits the guard in two:

- the hot path (`judge`): this step's loss and gradient norm are compared ON THE DEVICE with
  thresholds the history fixed before the step (`SpikeDetector.threshold()`: the rolling median,
  sigma and ratio line, passed to the kernels as Python scalars) and tested for non-finite
  values; the result is `ok`, a 0-dim bool tensor, and the values are copied, without waiting,
  to pinned host memory (`Staged`). The update is then masked by `ok` (guard/masked_step.py).
  Nothing is read back.
- the bookkeeping (`Staged.read`, then the same detectors and actions as `Guard.step`): at the
  next step's call (or `Guard.flush()`), once the device has long finished the copy, the values
  are read and fed to the detectors, which give the findings, the log rows, the escalations
  (R204, R203) and the next step's thresholds.

The device evaluates exactly the tests that can veto this step's own update: non-finite values
(R101) and spikes (R102, R103), with the formula `SpikeDetector.update` uses, in float64 as the
host does, so both paths take the same decisions (tests/test_guard_device.py replays many
random streams with NaNs and spikes through both). Findings that act through a rollback or a
halt (R104 divergence, R204, R203) are decided by the bookkeeping one step later, before the next
update: a rollback restores the checkpoint anyway, so the extra step computed meanwhile is only
lost work, never a different model.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from trainguard.errors import ConfigError
from trainguard.guard.arguments import metric_arg
from trainguard.guard.decision import DEVICE_CODES, Decision
from trainguard.guard.detectors.moe import router_summary
from trainguard.guard.judgement import Judgement

# What `step_async` returns: a Judgement on the device path (the name kept for loops that use it).
PendingStep = Judgement


def is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def grad_norm_tensor(model: Any) -> torch.Tensor | None:
    """The global L2 norm of the model's gradients as a 0-dim tensor (no host sync); None
    without gradients."""
    norms = [p.grad.detach().float().norm(2) for p in model.parameters() if p.grad is not None]
    if not norms:
        return None
    return torch.linalg.vector_norm(torch.stack(norms), 2)


@dataclass
class Staged:
    """This step's tensor metrics and its `ok` flag, on their way to pinned host memory."""

    names: list[str]
    host: torch.Tensor  # float64 (len(names) + 1,): the values, then ok as 0.0/1.0
    event: Any = None  # a CUDA event recorded after the copy; None on the CPU
    floats: dict[str, float | None] = field(default_factory=dict)  # host metrics as given

    def read(self) -> tuple[dict[str, float | None], bool]:
        """(the metrics as Python floats, whether the device let the update through). Waits for
        the copy, which the device finished long ago when this is called a step later."""
        if self.event is not None:
            self.event.synchronize()
        row = self.host.numpy().tolist()  # a host buffer: no device sync
        values = dict(self.floats)
        values.update(zip(self.names, row, strict=False))
        return values, bool(row[-1])


def _bad_on_device(guard: Any, name: str, x: torch.Tensor) -> torch.Tensor | None:
    """The veto conditions for one tensor metric, or None when none applies to it."""
    conds = []
    kind = guard.monitors.metrics.get(name)
    if kind in ("loss", "grad_norm") and guard.actions.get("R101", "apply") != "apply":
        conds.append(~torch.isfinite(x))
    spike = guard.monitors.monitors.get(f"{name}/spike")
    if spike is not None and guard.actions.get(spike.code, "apply") != "apply":
        threshold = spike.threshold()
        if threshold is not None:
            conds.append(spike.spiked(x, threshold))
    if not conds:
        return None
    bad = conds[0]
    for c in conds[1:]:
        bad = bad | c
    return bad


def _bad_on_host(guard: Any, name: str, x: float) -> bool:
    """The same conditions for a metric given as a Python float (known on the host already)."""
    kind = guard.monitors.metrics.get(name)
    if not math.isfinite(x):
        return kind in ("loss", "grad_norm") and guard.actions.get("R101", "apply") != "apply"
    spike = guard.monitors.monitors.get(f"{name}/spike")
    if spike is None or guard.actions.get(spike.code, "apply") == "apply":
        return False
    threshold = spike.threshold()
    return threshold is not None and bool(spike.spiked(x, threshold))


def judge(guard: Any, values: dict[str, Any]) -> tuple[torch.Tensor, Staged]:
    """The hot path: `ok` for this step on the device and its values staged for the host."""
    tensors: dict[str, torch.Tensor] = {}
    floats: dict[str, float | None] = {}
    for name, v in values.items():
        if is_tensor(v):
            # As Guard.step reads it (.float() then a Python float): the same float64 value.
            tensors[name] = v.detach().reshape(()).float().to(torch.float64)
        else:
            floats[name] = None if v is None else float(v)
    host_bad = any(_bad_on_host(guard, n, x) for n, x in floats.items() if x is not None)
    device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
    bad = torch.zeros((), dtype=torch.bool, device=device) | host_bad
    for name, x in tensors.items():
        b = _bad_on_device(guard, name, x)
        if b is not None:
            bad = bad | b
    ok = ~bad
    row = torch.stack([*tensors.values(), ok.to(torch.float64)])
    if device.type == "cuda":
        host = torch.empty(row.shape, dtype=row.dtype, pin_memory=True)
        host.copy_(row, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return ok, Staged(list(tensors), host, event, floats)
    return ok, Staged(list(tensors), row, None, floats)


def judge_async(
    guard: Any,
    step: int,
    values: dict[str, Any],
    model: Any = None,
    router_stats: Any = None,
    times: dict[str, float | None] | None = None,
) -> Judgement:
    """`Guard.step_async`'s work: settle the previous pending step (`flush`), then judge this
    one on the device and stage its values for the next read-back. `values` as the loop gave
    them (tensors stay where they are); `router_stats` may be a function, called at read-back;
    `times`: the step's data and step seconds (R605), host floats."""
    refuse_device_path(guard)
    resolved = flush(guard)
    if resolved is not None and resolved.action in ("rollback", "halt"):
        return Judgement(step, None, resolved, dropped=True, model=model)
    if values.get("grad_norm") is None and model is not None:
        values["grad_norm"] = grad_norm_tensor(model)
    values = {k: metric_arg(k, v) for k, v in values.items()}  # shapes only: no sync
    values |= times or {}
    # R601-R604: the stats, or a function that reads them, called when the step is read back
    # (`flush`), so that the step itself never waits for the device.
    guard._pending_router = router_stats
    ok, staged = judge(guard, values)
    pending = Judgement(step, ok, resolved, model=model)
    guard._pending = (pending, staged)
    return pending


def flush(guard: Any) -> Decision | None:
    """The pending step's bookkeeping now (one host read of its staged values): its Decision,
    or None when nothing is pending. A skipped update's host-side state is put back here
    (guard/masked_step.py), before anything can read it."""
    if guard._pending is None:
        return None
    pending, staged = guard._pending
    guard._pending = None
    values, applied = staged.read()
    router, guard._pending_router = guard._pending_router, None
    router_stats = router() if callable(router) else router
    if router_stats:
        values |= router_summary(router_stats)
    decision = guard._judge(pending.step, values, router_stats)
    vetoed = any(
        f.code in DEVICE_CODES and guard.actions.get(f.code, "apply") != "apply"
        for f in decision.findings
    )
    if not applied and pending.repair is not None:
        pending.repair.undo()
    if vetoed == applied:  # the two evaluations of one formula disagree: never expected
        warnings.warn(
            f"step {pending.step}: the device {'applied' if applied else 'skipped'} the "
            f"update but the detectors say {decision.action}; the device's choice stands",
            RuntimeWarning,
            stacklevel=3,
        )
    return decision


def refuse_device_path(guard: Any) -> None:
    """ConfigError for what the device cannot decide: a skip on a code other than R101-R103
    (the value is needed on the host), or metrics averaged over the ranks (a host sync)."""
    late = sorted(c for c, a in guard.actions.items() if a == "skip" and c not in DEVICE_CODES)
    if late and late != ["R204"]:
        raise ConfigError(
            f"guard.step_async decides skips on the device from R101-R103 only; "
            f"{', '.join(c for c in late if c != 'R204')} configured to skip needs the "
            "value on the host",
            "use guard.step for this configuration, or give those codes apply, rollback or halt",
        )
    part = guard.distributed
    if part is not None and part.active and part.agree_metrics:
        raise ConfigError(
            "guard.step_async cannot average the metrics over the ranks without a host sync",
            "all-reduce the loss yourself (the gradient norm after DDP is already shared) "
            "and build the part with DistributedGuards(..., agree_metrics=False), or use "
            "guard.step",
        )
