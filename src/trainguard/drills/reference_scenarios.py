"""Reference drills: a clean run is recorded as the reference (`trainguard reference record`),
then later runs of the same recipe are compared with it (`--set reference.path=...`).

- `reference_rerun`      quiet: a clean rerun (same environment: bitwise equal) and a rerun
                         with train.threads=2 (another thread count: the band) raise nothing
- `reference_attention`  attention scaled by 1/d instead of 1/sqrt(d): R502 (bitwise)
- `reference_init`       residual projections initialised without 1/sqrt(2 n_layers): R502
- `reference_tokenizer`  the tokenizer's last BPE merge dropped: R503 (the data differs)
- `reference_schedule`   the learning-rate schedule advancing two steps per step, run with 2
                         threads so that only the band can catch it: R501

The changes are planted by `drills/planted.py` in the drill's process only. Nothing is repaired,
so these rows do not train to recover: "recovered" means the run finished and was reported.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from trainguard.drills.matrix import DrillRow
from trainguard.drills.runner import DrillContext, RunOutcome
from trainguard.util.processes import child_env

CODES = ("R501", "R502", "R503", "R504", "R505", "H101")
_lock = threading.Lock()
_recorded: dict[Path, Path | str] = {}


def reference_file(ctx: DrillContext) -> Path:
    """The drill's reference: a clean run at the drill settings, recorded once per workdir
    (drills may run side by side). Raises RuntimeError when it cannot be made."""
    with _lock:
        if ctx.workdir not in _recorded:
            _recorded[ctx.workdir] = _record(ctx)
    made = _recorded[ctx.workdir]
    if isinstance(made, str):
        raise RuntimeError(made)
    return made


def _record(ctx: DrillContext) -> Path | str:
    base = ctx.launch("reference_base")
    if base.returncode != 0:
        return f"the reference run exited {base.returncode}: {base.tail()}"
    out = ctx.workdir / "reference.json"
    args = [sys.executable, "-m", "trainguard", "reference", "record", str(base.run_dir)]
    proc = subprocess.run(
        [*args, "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
    )
    if proc.returncode != 0:
        return f"reference record exited {proc.returncode}: {proc.stderr.strip()[-400:]}"
    return out


def compared(ctx: DrillContext, name: str, planted: str | None = None, *extra: str) -> RunOutcome:
    """One run of the drill recipe compared with the drill's reference."""
    settings = (f"reference.path={reference_file(ctx)}", *extra)
    return ctx.launch(name, extra=settings, planted=planted)


def _summary(out: RunOutcome) -> dict[str, Any]:
    return next((f["data"] for f in out.findings if f["code"] == "R506"), {})


def _detection_step(out: RunOutcome, codes: tuple[str, ...]) -> int | None:
    steps = []
    for f in out.findings:
        if f["code"] in codes:
            data = f.get("data") or {}
            at = data.get("verdict_step", f.get("step"))
            steps.append(at if isinstance(at, int) else 0)
    return min(steps) if steps else None


def _action(finding: dict[str, Any]) -> str:
    data = finding.get("data") or {}
    if finding["code"] == "R501":
        return (
            f"reported: left the band at step {data.get('first_step')} (verdict at step "
            f"{data.get('verdict_step')}, {data.get('mean_difference', 0):+.3f} nats per step)"
        )
    if finding["code"] == "R502":
        return (
            f"reported: bitwise departure at step {data.get('first_step')} "
            f"({data.get('difference', 0):+.2g} nats)"
        )
    if finding["code"] == "R503":
        return f"reported before the first step: {', '.join(data.get('changed', []))} changed"
    return "reported: " + finding["message"][:120]


def planted_row(ctx: DrillContext, name: str, planted: str, expected: str, *extra: str) -> DrillRow:
    out = compared(ctx, name, planted, *extra)
    row = DrillRow(name, "", [expected], inject=f"planted {planted}", trains=False)
    row.detected = [c for c in dict.fromkeys(out.codes()) if c in CODES]
    at = _detection_step(out, (expected,))
    row.steps_to_detect = None if at is None else max(0, at)  # planted from step 0 on
    first = next((f for f in out.findings if f["code"] == expected), None)
    if first is not None:
        row.action = _action(first)
    row.steps_lost = 0
    row.finished = out.returncode == 0 and out.final_step == ctx.plan.max_steps
    row.final_loss = out.final_loss
    if not row.finished:
        row.note = f"run exited {out.returncode} at step {out.final_step}: {out.tail()}"
    return row


def rerun_row(ctx: DrillContext) -> DrillRow:
    """Quiet: both reruns compare with the reference without a warning or an error."""
    same = compared(ctx, "reference_rerun")
    threads = compared(ctx, "reference_threads", None, "train.threads=2")
    row = DrillRow("reference_rerun", "", [], quiet=True, trains=False)
    for out in (same, threads):
        row.alarms += [
            f["code"]
            for f in out.findings
            if f["code"] in CODES and f["severity"] in ("warning", "error")
        ]
    row.alarms = sorted(set(row.alarms))
    a, b = _summary(same), _summary(threads)
    row.finished = all(o.returncode == 0 for o in (same, threads)) and bool(a) and bool(b)
    same_how = "bitwise equal" if a.get("bitwise_equal") else "within the band"
    row.action = (
        f"rerun: {same_how} at {a.get('compared')} steps; 2 threads: largest difference "
        f"{b.get('max_abs_diff', 0):.2g} within noise {b.get('noise_sigma', 0):.3g}"
    )
    if a.get("bitwise_expected") and not a.get("bitwise_equal"):
        row.alarms.append("not-bitwise")  # R502 would say so too; belt and braces
    row.steps_lost = 0
    row.final_loss = same.final_loss
    if not row.finished:
        row.note = "a rerun did not finish or compared nothing: " + (same.tail() or threads.tail())
    return row


# name -> (fault, drill function); registered by drills/scenarios.py
REFERENCE_DRILLS = {
    "reference_rerun": (
        "clean reruns vs the reference (same environment; train.threads=2)",
        rerun_row,
    ),
    "reference_attention": (
        "attention scale 1/d instead of 1/sqrt(d)",
        lambda ctx: planted_row(ctx, "reference_attention", "attention_scale", "R502"),
    ),
    "reference_init": (
        "residual projections initialised without 1/sqrt(2 n_layers)",
        lambda ctx: planted_row(ctx, "reference_init", "init_unscaled", "R502"),
    ),
    "reference_tokenizer": (
        "tokenizer with its last BPE merge dropped",
        lambda ctx: planted_row(
            ctx,
            "reference_tokenizer",
            "tokenizer_merge",
            "R503",
            f"data.cache_dir={ctx.workdir / 'cache-planted-tokenizer'}",
        ),
    ),
    "reference_schedule": (
        "learning-rate schedule two steps per step, 2 threads (band only)",
        lambda ctx: planted_row(
            ctx, "reference_schedule", "lr_schedule_2x", "R501", "train.threads=2"
        ),
    ),
}
