"""A significant drop of an eval metric between evaluations is a finding (E121).

Not a raw difference: small evals are noisy (200 four-way questions give accuracy +/- 0.03), so
a raw threshold either fires on noise or misses real regressions. Each metric is compared with
its best earlier value:
- accuracies (`<task>/acc`, `acc_norm`, `canaries/pass_rate`, with a `<task>/n` count): a
  one-sided two-proportion test (normal approximation to the binomial with pooled variance;
  Fisher's exact test when counts are small);
- bits per byte (`<task>/bpb` with `<task>/bpb_se`): a one-sided z-test on the difference of
  per-text means (the CLT over texts, which is what a bootstrap of texts would estimate).
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.findings import Finding

ACC_SUFFIXES = ("/acc", "/acc_norm", "/pass_rate")


def proportion_drop_pvalue(k_ref: int, n_ref: int, k_new: int, n_new: int) -> float:
    """P-value of H0 "the new accuracy is not lower" against a drop from k_ref/n_ref."""
    from scipy import stats  # here: scipy.stats takes longer to import than a resumed step

    if n_ref <= 0 or n_new <= 0:
        return 1.0
    if min(k_ref, n_ref - k_ref, k_new, n_new - k_new) < 5:
        table = [[k_ref, n_ref - k_ref], [k_new, n_new - k_new]]
        return float(stats.fisher_exact(table, alternative="greater").pvalue)
    p_ref, p_new = k_ref / n_ref, k_new / n_new
    pooled = (k_ref + k_new) / (n_ref + n_new)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_ref + 1 / n_new))
    if se == 0:
        return 1.0 if p_new >= p_ref else 0.0
    return float(stats.norm.sf((p_ref - p_new) / se))


def mean_rise_pvalue(ref: float, se_ref: float, new: float, se_new: float) -> float:
    """P-value of H0 "the new value is not higher" (bits per byte: higher is worse)."""
    from scipy import stats

    se = math.hypot(se_ref, se_new)
    if se == 0:
        return 1.0 if new <= ref else 0.0
    return float(stats.norm.sf((new - ref) / se))


class EvalDriftMonitor:
    """`update(step, metrics)` with the metrics of one evaluation -> E121 findings."""

    def __init__(self, alpha: float = 0.01) -> None:
        self.alpha = alpha
        self.best: dict[str, dict[str, float]] = {}

    def update(self, step: int, metrics: dict[str, float]) -> list[Finding]:
        out = []
        for key, value in sorted(metrics.items()):
            if value is None or not math.isfinite(value):
                continue
            task = key.rsplit("/", 1)[0]
            n = metrics.get(f"{task}/n")
            if key.endswith(ACC_SUFFIXES) and n:
                out += self._check(step, key, value, n, None, higher_is_better=True)
            elif key.endswith("/bpb") and n:
                out += self._check(
                    step,
                    key,
                    value,
                    n,
                    metrics.get(f"{task}/bpb_se", 0.0),
                    higher_is_better=False,
                )
        return out

    def _check(self, step, key, value, n, se, higher_is_better) -> list[Finding]:
        best = self.best.get(key)
        found = []
        if best is not None:
            if higher_is_better:
                p = proportion_drop_pvalue(
                    round(best["value"] * best["n"]), int(best["n"]), round(value * n), int(n)
                )
            else:
                p = mean_rise_pvalue(best["value"], best["se"], value, se or 0.0)
            if p < self.alpha:
                found.append(
                    Finding.of(
                        "E121",
                        f"{key} fell from {best['value']:.4g} (step {int(best['step'])}) to "
                        f"{value:.4g}: p={p:.2g} < alpha={self.alpha}",
                        step=step,
                        metric=key,
                        data={
                            "best": best["value"],
                            "best_step": int(best["step"]),
                            "value": value,
                            "p_value": p,
                        },
                    )
                )
        better = best is None or (
            value > best["value"] if higher_is_better else value < best["value"]
        )
        if better:
            self.best[key] = {"value": value, "n": float(n), "se": float(se or 0.0), "step": step}
        return found

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "best": {k: dict(v) for k, v in self.best.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alpha = float(state["alpha"])
        self.best = {k: dict(v) for k, v in state["best"].items()}
