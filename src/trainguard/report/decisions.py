"""The guard's decisions in the report: every step it did not simply apply (skip, rollback,
halt), each linked to its batch view, a page the report writes beside itself
(`batches/step-N.html`, `trainguard batch --html`'s page) for the first `MAX_PAGES` of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.errors import TrainguardError
from trainguard.report.batch import LINKED_CODES, batch_command, decode_batch

MAX_PAGES = 20  # a storm of skips links its first pages; the command works for every step
PAGES = "batches"


def page_name(step: int) -> str:
    return f"{PAGES}/step-{step}.html"


def page_href(info: dict[str, Any], step: object) -> str:
    """The link to the batch page of `step` when the report wrote one, else ""."""
    return page_name(step) if step in info.get("batch_pages", ()) else ""  # type: ignore[arg-type]


def decisions(steps: list[dict[str, Any]], run_dir: Path) -> list[dict[str, Any]]:
    """One entry per step row whose action is not `apply`, in log order."""
    return [
        {
            "step": r["step"],
            "action": r.get("action"),
            "loss": r.get("loss"),
            "grad_norm": r.get("grad_norm"),
            "batch": batch_command(run_dir, r["step"]),
        }
        for r in steps
        if isinstance(r.get("step"), int) and r.get("action") not in (None, "apply")
    ]


def batch_pages(info: dict[str, Any], render: Any) -> dict[int, str]:
    """{step: the HTML of its batch view} for the decided steps (and the steps of findings a
    batch explains) that can be decoded; a step that cannot (no sampler in the record, the
    prepared data gone) keeps its command line only."""
    wanted = [d["step"] for d in info["decisions"]]
    wanted += [
        f["step"]
        for f in info["findings"]
        if f.get("code") in LINKED_CODES and isinstance(f.get("step"), int) and f["step"] >= 0
    ]
    pages: dict[int, str] = {}
    for step in dict.fromkeys(wanted):
        if len(pages) >= MAX_PAGES:
            break
        try:
            view = decode_batch(info["run_dir"], step, with_losses=False)  # no checkpoint read
        except TrainguardError:
            continue
        if view.samples:
            pages[step] = render(view, info["run_dir"])
    return pages
