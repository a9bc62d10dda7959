"""What the report shows of a run's findings: one row per episode (`findings.group_episodes`),
each with the `trainguard batch` command of its first step where it has one, and how many
updates the guard skipped (report/skips.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.codes import SEVERITIES
from trainguard.findings import Episode, EpisodeGrouper, Finding, step_interval
from trainguard.report.batch import LINKED_CODES, batch_command
from trainguard.report.decisions import page_href
from trainguard.report.skips import average_of, skipped_updates


def _batch_link(run_dir: Path, finding: dict[str, Any]) -> str:
    """The command that shows the batch behind a guard finding, a skip or a rollback; else
    "". Steps count from 0 in every run record (`metrics.record_read`)."""
    step = finding.get("step")
    if finding.get("code") in LINKED_CODES and isinstance(step, int) and step >= 0:
        return batch_command(run_dir, step)
    return ""


def finding_rows(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The finding rows as episodes (`findings.group_episodes`: consecutive findings of one code
    in one row), in order; a row that is not a well-formed finding stays a row of its own,
    shown as it is (escaped by the template)."""
    steps = sorted({r["step"] for r in info["steps"] if isinstance(r["step"], int)})
    grouper = EpisodeGrouper(step_interval(steps))
    out: list[tuple[Episode | None, dict[str, Any]]] = []
    for row in info["findings"]:
        try:
            finding = Finding.from_dict(row)
        except (TypeError, ValueError):  # no code or message, or an unknown severity
            out.append((None, row))
            continue
        episode, new = grouper.add(finding)
        if new:
            out.append((episode, row))
    shown = []
    for episode, row in out:
        entry = {
            "code": row.get("code"),
            "severity": row.get("severity"),
            "step": row.get("step"),
            "count": 1,
            "message": row.get("message"),
            "fix": row.get("fix") or "",
            "batch": _batch_link(info["run_dir"], row),
            "href": page_href(info, row.get("step")),
        }
        if episode is not None:
            worst = ""
            if episode.worst_step is not None and episode.worst_step != episode.first_step:
                worst = f" (worst {episode.worst_value} at step {episode.worst_step})"
            entry |= {
                "severity": episode.severity,
                "step": episode.steps.removeprefix("steps ").removeprefix("step "),
                "count": episode.count,
                "message": f"{episode.first.message}{worst}",
            }
        sev = entry["severity"]
        entry["severity_class"] = sev if sev in SEVERITIES else "other"
        shown.append(entry)
    return shown


def skips_summary(steps: list[dict[str, Any]], loop: str = "trainguard run") -> dict[str, Any]:
    """How many updates the guard skipped (step rows with `action: skip`), and what the loop's
    own training-loss average makes of them (report/skips.py)."""
    skipped = skipped_updates(
        sorted({r["step"] for r in steps if r.get("action") == "skip"}), average_of(loop)
    )
    shown = ", ".join(map(str, skipped["steps"][:20])) + ("..." if skipped["count"] > 20 else "")
    return {
        "skipped updates": f"{skipped['count']} (steps {shown})" if skipped["count"] else 0,
        "train loss average": skipped["train_loss_average"],
    }
