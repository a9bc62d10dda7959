"""The outcome of a chaos soak (`drills/chaos.py`): per fault kind what it cost, the soak's
goodput, and the findings that fail it (R401: a fault not detected; R402: a round that did
not end, or whose final weights differ from its reference run's)."""

from __future__ import annotations

import statistics
from typing import Any

from trainguard.drills.chaos import FaultResult, Round
from trainguard.findings import Finding
from trainguard.goodput.accounting import CATEGORIES


def summary(rounds: list[Round]) -> dict[str, Any]:
    """Per fault kind: how many, detected, median detection latency and recovery time, steps
    lost in all; and the soak's goodput (the rounds' categories added up)."""
    by_kind: dict[str, list[FaultResult]] = {}
    for r in rounds:
        for f in r.faults:
            by_kind.setdefault(f.fault.kind, []).append(f)

    def median(values: list[float | int | None]) -> float | None:
        got = [v for v in values if v is not None]
        return statistics.median(got) if got else None

    kinds = {
        kind: {
            "count": len(fs),
            "detected": sum(f.detected for f in fs),
            "median_detect_s": median([f.detect_s for f in fs]),
            "median_detect_steps": median([f.detect_steps for f in fs]),
            "median_recovery_s": median([f.recovery_s for f in fs]),
            "steps_lost": sum(f.steps_lost or 0 for f in fs),
        }
        for kind, fs in by_kind.items()
    }
    seconds = {k: sum(r.goodput["seconds"].get(k, 0.0) for r in rounds) for k in CATEGORIES}
    wall = sum(r.goodput["wall_s"] for r in rounds)
    return {
        "kinds": kinds,
        "goodput": seconds["productive"] / wall if wall > 0 else None,
        "wall_s": wall,
        "seconds": seconds,
    }


def verdict(rounds: list[Round]) -> list[Finding]:
    """R401 for each fault not detected; R402 for a round that did not reach its last step or
    whose final model differs from the reference run's (something was lost)."""
    out = []
    for r in rounds:
        for f in r.faults:
            if not f.detected:
                out.append(
                    Finding.of(
                        "R401",
                        f"chaos round {r.number}: {f.fault.label} ({f.fault.inject}) was not "
                        f"detected{': ' + f.note if f.note else ''}",
                        step=f.fault.step,
                    )
                )
        if not r.finished:
            out.append(
                Finding.of(
                    "R402",
                    f"chaos round {r.number}: the run did not reach its last step (it ended at "
                    f"step {r.final_step}, exit {r.launches[-1].returncode}); run dir {r.run_dir}",
                )
            )
        elif r.bitwise_equal is not True:
            out.append(
                Finding.of(
                    "R402",
                    f"chaos round {r.number}: the final weights differ from the reference run's "
                    f"(or one has no checkpoint): the restarts lost or changed work; run dir "
                    f"{r.run_dir}",
                )
            )
    return out
