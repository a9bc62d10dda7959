"""Each variant against the base on every metric both have, paired by seed (`stats.py`), and
the findings that say it: D430 worse, D431 better, D434 no detectable difference on the
use-case evals, D433 few seeds."""

from __future__ import annotations

from typing import Any

from trainguard.ablation.heldout import HELDOUT_METRIC, KEPT_PREFIX
from trainguard.ablation.stats import MIN_SEEDS_FOR_SIGN_TEST, NO_DIFFERENCE, paired_effect
from trainguard.findings import Finding

BASE = "base"


def compare(
    scores: dict[str, dict[str, dict[str, float]]], variants: list[str], level: float = 0.95
) -> tuple[dict[str, Any], list[Finding]]:
    """Each variant against the base on every metric both have, paired by seed."""
    out: dict[str, Any] = {}
    findings: list[Finding] = []
    base = scores.get(BASE, {})
    for name in variants:
        mine = scores.get(name, {})
        seeds = sorted(set(base) & set(mine), key=int)
        shared = {m for s in seeds for m in base[s]} & {m for s in seeds for m in mine[s]}
        # Another variant's kept held-out set says nothing about this one.
        shared = {
            m
            for m in shared
            if not m.startswith(KEPT_PREFIX) or m.startswith(f"{KEPT_PREFIX}{name}/")
        }
        metrics = sorted(shared, key=lambda m: (m.startswith("ablation_"), m))
        effects = []
        for metric in metrics:
            paired = [s for s in seeds if metric in base[s] and metric in mine[s]]
            if not paired:
                continue
            e = paired_effect(
                metric, [base[s][metric] for s in paired], [mine[s][metric] for s in paired], level
            )
            effects.append(e.to_dict())
            if e.verdict != NO_DIFFERENCE:
                code = "D430" if e.verdict == "worse" else "D431"
                extra: dict[str, Any] = {}
                note = ""
                if metric == HELDOUT_METRIC and e.verdict == "worse":
                    # BASE's held-out set holds the kind of text the filter removes on purpose:
                    # worse there is expected, not a warning; the kept set is the fair one.
                    extra["severity"] = "info"
                    note = (
                        "; BASE's held-out set holds what the filter removes, so this is "
                        f"expected of a filter: {KEPT_PREFIX}{name}/bpb scores what it keeps"
                    )
                findings.append(
                    Finding.of(
                        code,
                        f"variant {name} is {e.verdict} than base on {metric}: {e.diff:+.4g} "
                        f"({level:.0%} CI [{e.low:+.4g}, {e.high:+.4g}], {e.seeds} seeds, paired "
                        f"t p={e.p_t:.3g}){note}",
                        metric=metric,
                        data={"variant": name, **e.to_dict()},
                        **extra,
                    )
                )
        seen = min((e["seeds"] for e in effects), default=0)
        verdict = use_case_verdict(effects)
        if effects and verdict == NO_DIFFERENCE:
            use = [e["metric"] for e in effects if not e["metric"].startswith("ablation_")]
            findings.append(
                Finding.of(
                    "D434",
                    f"variant {name}: {NO_DIFFERENCE} on the use-case evals "
                    f"({', '.join(use)}; {seen} seeds)",
                    data={"variant": name, "verdict": NO_DIFFERENCE},
                )
            )
        if effects and seen < MIN_SEEDS_FOR_SIGN_TEST:
            findings.append(
                Finding.of(
                    "D433",
                    f"variant {name}: only {seen} paired seed(s); the sign-flip test "
                    f"cannot go below p={2 / 2**seen:.3g}, and an interval from so few seeds "
                    "detects only large effects",
                    data={"variant": name, "seeds": seen},
                )
            )
        out[name] = {"seeds": seen, "verdict": verdict, "effects": effects}
    return out, findings


def use_case_verdict(effects: list[dict[str, Any]]) -> str:
    """The variant's verdict on the use-case evals (not the held-out sets): `worse` when any
    metric is worse, `better` when one is better and none worse, else NO_DIFFERENCE."""
    verdicts = {e["verdict"] for e in effects if not e["metric"].startswith("ablation_")}
    for v in ("worse", "better"):
        if v in verdicts:
            return v
    return NO_DIFFERENCE
