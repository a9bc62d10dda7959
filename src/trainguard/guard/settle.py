"""`Guard.settle`: acting on a decision in one place, for every loop (the host path, the device
path, `trainguard run`, the Trainer adapters, your own).

In order: the rerun the guard asked for (R205/R206), the rollback (through `Guard.rollback`),
the halt (RunHalted). A skip or an apply needs nothing more here: `Judgement.optimizer_step`
applies, skips or masks the update as judged.

The rerun: the loop passes `rerun(step)`, a function that recomputes step `step` (forward and
backward) from the same weights on the same batch and returns its loss and gradient norm (or
the loss alone: the norm is then the model's). The weights are the ones the step saw, since a
step the guard reruns is one whose update it refused (on the device path too: the update was
masked). The gradients the loop holds now (on the device path, the next step's) are set aside
during the rerun and put back after it. The first and the second result are compared
(`rerun.classify_rerun`): different is hardware (R205), the same is data or software (R206).
With several ranks the second result is averaged over them as the first was, so that every
rank records the same verdict; every rank must rerun.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainguard.errors import ConfigError
from trainguard.findings import Finding
from trainguard.guard.arguments import metric_float
from trainguard.guard.decision import STRENGTH, Decision
from trainguard.guard.judgement import Judgement, Settled

Rerun = Callable[[int], Any]
"""`rerun(step) -> (loss, grad_norm)` or `-> loss`: step `step` computed again."""


def settle(
    guard: Any,
    what: Judgement | Decision | None,
    *,
    rerun: Rerun | None = None,
    checkpointer: Any = None,
    state: dict[str, Any] | None = None,
    sampler: Any = None,
    defer: bool = False,
) -> Settled:
    decision = what.known if isinstance(what, Judgement) else what
    if decision is None:
        return Settled()
    if decision.rerun and rerun is not None and not decision_has_verdict(decision):
        model = what.model if isinstance(what, Judgement) else None
        verdict = rerun_step(guard, decision, rerun, model or guard.last_model)
        decision.findings.append(verdict)
        guard.report([verdict])
    if decision.action not in ("rollback", "halt"):
        return Settled(decision)
    if defer:
        return Settled(decision, stop=True)
    decision.raise_if_halt()
    if checkpointer is None:  # the loop rolls back itself (`guard.pending_rollback` is kept)
        return Settled(decision, stop=True)
    if state is None or sampler is None:
        raise ConfigError(
            "guard.settle(..., checkpointer=...) rolls back, and needs state= and sampler=",
            "pass the dict of objects the checkpointer saves and the ElasticSampler",
        )
    return Settled(decision, rolled_back_to=guard.rollback(checkpointer, state, sampler))


def merged(flushed: Decision, end: Decision) -> Decision:
    """`after_update` with a read-back: the step's own decision and the replicas' as one (the
    stronger action, both findings; the rerun and the values are the step's)."""
    if STRENGTH[end.action] <= STRENGTH[flushed.action]:
        flushed.findings += end.findings
        return flushed
    end.findings = flushed.findings + end.findings
    end.values, end.rerun = flushed.values, flushed.rerun
    return end


def decision_has_verdict(decision: Decision) -> bool:
    """Settled twice (an adapter that settles again at the end): one rerun is enough."""
    return any(f.code in ("R205", "R206") for f in decision.findings)


def rerun_step(guard: Any, decision: Decision, rerun: Rerun, model: Any) -> Finding:
    """Recompute the step with `rerun` (the current gradients set aside) and classify it."""
    params = list(model.parameters()) if model is not None else []
    kept = [p.grad for p in params]
    for p in params:
        p.grad = None  # the rerun's backward starts from no gradient, as the step's did
    try:
        out = rerun(decision.step)
        loss, norm = out if isinstance(out, tuple) else (out, None)
        if norm is None and model is not None:
            from trainguard.guard.device import grad_norm_tensor

            norm = grad_norm_tensor(model)
    finally:
        for p, g in zip(params, kept, strict=True):
            p.grad = g
    second = {"loss": metric_float("loss", loss), "grad_norm": metric_float("grad_norm", norm)}
    part = guard.distributed
    if part is not None and part.active and part.agree_metrics:
        second = part.agree(decision.step, second)  # as the first was: the same on every rank
    first = decision.values
    keys = [k for k in ("loss", "grad_norm") if first.get(k) is not None and second[k] is not None]
    return guard.classify_rerun(
        [first[k] for k in keys], [second[k] for k in keys], step=decision.step
    )
