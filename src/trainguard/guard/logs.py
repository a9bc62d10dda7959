"""Where the Guard writes what it saw: guard.jsonl (findings and events), the run record
(`guard.record`: metrics.jsonl step rows and run.json, docs/run-record.md) and the metric
sinks (TensorBoard, W&B). Each step's row is written from the values the step's one host sync
already read: writing costs no further device read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.findings import Finding
    from trainguard.guard.decision import Decision
    from trainguard.guard.detectors.moe import RouterStats


def log_step(
    guard: Any,
    step: int,
    values: dict[str, float | None],
    decision: Decision,
    router_stats: RouterStats | None = None,
) -> None:
    """Step `step`'s row, decision and findings to every place the guard writes."""
    if guard.timing is not None:  # the values read in this step's one host sync: no more
        guard.timing.step(step, values, decision.action, router_stats)
    log_findings(guard, decision.findings)
    if guard.sinks.viewers:
        metrics = {k: v for k, v in values.items() if v is not None}
        guard.sinks.write({"kind": "step", "step": step, **metrics, "action": decision.action})


def log_findings(guard: Any, findings: list[Finding]) -> None:
    """Findings to guard.jsonl, the run record and every sink."""
    for row in ({"kind": "finding", **f.to_dict()} for f in findings):
        if guard._findings_log is not None:
            guard._findings_log.write(row)
        if guard.timing is not None:  # the record (held until the first step)
            guard.timing.write(row)
        if guard.sinks.viewers:
            guard.sinks.write(row)


def close_logs(guard: Any) -> None:
    """Flush and close guard.jsonl, the run record and the metric sinks."""
    if guard._findings_log is not None:
        guard._findings_log.close()
    if guard.timing is not None:  # the held rows and the end row, then the file
        guard.timing.close()
        guard.record.close()
    guard.sinks.close()
