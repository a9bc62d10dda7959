"""Doctor drills: `trainguard doctor --quick --nproc 2 --inject KIND/r1`, one real 2-process
job per fault, each checked for the code that must name rank 1 (and no other rank).

- `doctor_bitflip`        a wrong matmul result on rank 1: H401
- `doctor_slow`           rank 1 three times slower: H403
- `doctor_bad_allreduce`  rank 1 contributes a perturbed tensor: H410
- `doctor_hang`           rank 1 never joins (hang timeout 5 s): H412; the doctor itself must
                          end with a verdict, not hang

Nothing is trained: the row's "recovered" means the doctor returned its verdict (exit 1 with a
report) instead of hanging or crashing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from trainguard.drills.matrix import DrillRow
from trainguard.drills.runner import DrillContext
from trainguard.util.processes import child_env

RANK = 1
HANG_TIMEOUT_S = 5
PROCESSES = 2  # ranks of each doctor job (`drill` counts them against the cores)


def run_doctor(ctx: DrillContext, inject: str, *settings: str) -> tuple[int, dict | None, str]:
    """One `trainguard doctor --quick --nproc 2 --json` job: status, report, stderr tail."""
    args = [sys.executable, "-m", "trainguard", "doctor", ctx.recipe, "--quick", "--json"]
    # --oversubscribe: `drill` has checked its jobs' processes against the machine already.
    args += ["--nproc", str(PROCESSES), "--oversubscribe", "--inject", inject]
    for s in [*ctx.overrides, *settings]:
        args += ["--set", s]
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=ctx.timeout_s, env=child_env()
        )
    except subprocess.TimeoutExpired:
        return 124, None, f"the doctor did not end within {ctx.timeout_s:.0f}s"
    try:
        payload = json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        payload = None
    return proc.returncode, payload, proc.stderr.strip()[-400:]


def judge(
    name: str, inject: str, code: str, status: int, payload: dict | None, note: str = ""
) -> DrillRow:
    """The row of one doctor job: detected when `code` names rank `RANK`; "recovered" when the
    doctor ended with its verdict (exit 1 and a report) and named no other rank."""
    row = DrillRow(name, "", [code], inject=inject, trains=False)
    findings: list[dict[str, Any]] = (payload or {}).get("findings", [])
    named = [f for f in findings if f["code"] == code and f.get("rank") == RANK]
    wrong = [f for f in findings if f["severity"] == "error" and f.get("rank") != RANK]
    row.detected = [code] if named else []
    row.detected += sorted({f["code"] for f in findings if f["code"] != code})
    if wrong:
        row.detected.append("wrong-rank")
        row.note = "errors naming other ranks: " + "; ".join(f["message"] for f in wrong)
    row.steps_to_detect = 0
    row.steps_lost = 0
    who = f"rank {RANK} ({named[0].get('where')})" if named else "nobody"
    row.action = f"{who} named; doctor exit {status}" + (f" {note}" if note else "")
    row.finished = status == 1 and payload is not None and not wrong
    if payload is None:
        row.note = (row.note + "; " if row.note else "") + f"no report (exit {status})"
    return row


def doctor_row(ctx: DrillContext, name: str, kind: str, code: str, *settings: str) -> DrillRow:
    inject = f"{kind}/r{RANK}"
    t0 = time.perf_counter()
    status, payload, tail = run_doctor(ctx, inject, *settings)
    row = judge(name, inject, code, status, payload, f"in {time.perf_counter() - t0:.1f}s")
    if payload is None:
        row.note += f": {tail}"
    return row


def doctor_bitflip(ctx: DrillContext) -> DrillRow:
    return doctor_row(ctx, "doctor_bitflip", "bitflip", "H401")


def doctor_slow(ctx: DrillContext) -> DrillRow:
    return doctor_row(ctx, "doctor_slow", "slow", "H403")


def doctor_bad_allreduce(ctx: DrillContext) -> DrillRow:
    return doctor_row(ctx, "doctor_bad_allreduce", "bad-allreduce", "H410")


def doctor_hang(ctx: DrillContext) -> DrillRow:
    setting = f"distributed.hang_timeout_s={HANG_TIMEOUT_S}"
    return doctor_row(ctx, "doctor_hang", "hang", "H412", setting)


# name -> (fault shown in the matrix, drill); registered by drills/scenarios.py, in this order.
DOCTOR_DRILLS = {
    "doctor_bitflip": ("doctor: wrong matmul result on one rank (2 ranks)", doctor_bitflip),
    "doctor_slow": ("doctor: one rank 3x slower (2 ranks)", doctor_slow),
    "doctor_bad_allreduce": (
        "doctor: one rank contributes a wrong all-reduce tensor (2 ranks)",
        doctor_bad_allreduce,
    ),
    "doctor_hang": ("doctor: one rank never joins (2 ranks)", doctor_hang),
}
