"""Chinchilla approach 3: fit L(N, D) = E + A / N^alpha + B / D^beta to gating runs.

As in Hoffmann et al. (2022, section 3.3 and appendix D.2) and the replication of Besiroglu et
al. (2024):

- parameters theta = (a, b, e, alpha, beta) with A = exp(a), B = exp(b), E = exp(e), so that
  log L_hat = LSE(a - alpha log N, b - beta log D, e);
- objective: the *sum* over runs of Huber_delta(log L_hat - log L) with delta = 1e-3 (Besiroglu
  et al. found that a mean objective lets L-BFGS stop early, which gave Chinchilla its
  implausibly narrow intervals);
- L-BFGS (scipy) from a grid of starting points, keeping the best converged result;
- uncertainty by bootstrap: resample runs with replacement and refit.

Speed: the objective and its analytic gradient are numpy-vectorised over runs, and the whole
starting grid is scored in one (starts x runs) array operation. The full fit runs L-BFGS from the
best `n_starts` grid points (all of them when `n_starts=None`); each bootstrap refit starts from
the full-data optimum and the `boot_starts` best grid points of its resample, which is where
L-BFGS from the rest of the grid ends up anyway.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize

from trainguard.errors import BadInputError
from trainguard.findings import Finding

HUBER_DELTA = 1e-3

# Hoffmann et al., appendix D.2: the initialisation grid.
GRID_ALPHA = np.arange(0.0, 2.0 + 1e-9, 0.5)
GRID_BETA = np.arange(0.0, 2.0 + 1e-9, 0.5)
GRID_E = np.arange(-1.0, 1.0 + 1e-9, 0.5)
GRID_A = np.arange(0.0, 25.0 + 1e-9, 5.0)
GRID_B = np.arange(0.0, 25.0 + 1e-9, 5.0)


def init_grid() -> np.ndarray:
    """All starting points as rows (a, b, e, alpha, beta): 6 * 6 * 5 * 5 * 5 = 4500."""
    mesh = np.meshgrid(GRID_A, GRID_B, GRID_E, GRID_ALPHA, GRID_BETA, indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1)


@dataclass
class ScalingLaw:
    """L(N, D) = E + A / N^alpha + B / D^beta."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    @classmethod
    def from_theta(cls, theta: np.ndarray) -> ScalingLaw:
        a, b, e, alpha, beta = (float(x) for x in theta)
        return cls(E=math.exp(e), A=math.exp(a), B=math.exp(b), alpha=alpha, beta=beta)

    def theta(self) -> np.ndarray:
        return np.array([math.log(self.A), math.log(self.B), math.log(self.E), self.alpha, self.beta])

    def predict(self, params: Any, tokens: Any) -> np.ndarray:
        n, d = np.asarray(params, float), np.asarray(tokens, float)
        return self.E + self.A / n**self.alpha + self.B / d**self.beta

    def to_dict(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "B": self.B, "alpha": self.alpha, "beta": self.beta}


def _log_pred(thetas: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> tuple[np.ndarray, ...]:
    """log L_hat for thetas (S, 5) over runs (R,): returns (S, R) and the softmax weights."""
    a, b, e, alpha, beta = (thetas[:, i : i + 1] for i in range(5))
    terms = np.stack(
        [a - alpha * log_n, b - beta * log_d, np.broadcast_to(e, (len(thetas), len(log_n)))]
    )  # (3, S, R)
    top = terms.max(axis=0)
    ex = np.exp(terms - top)
    tot = ex.sum(axis=0)
    return top + np.log(tot), ex / tot


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    ar = np.abs(r)
    return np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta))


def objective(theta: np.ndarray, log_n, log_d, log_l, delta: float = HUBER_DELTA):
    """The summed Huber objective and its gradient, for scipy's L-BFGS."""
    pred, w = _log_pred(theta[None, :], log_n, log_d)
    r = pred[0] - log_l  # (R,)
    g_r = np.clip(r, -delta, delta)  # d Huber / d r
    w1, w2, w3 = w[0, 0], w[1, 0], w[2, 0]
    grad = np.array(
        [
            (g_r * w1).sum(),
            (g_r * w2).sum(),
            (g_r * w3).sum(),
            -(g_r * w1 * log_n).sum(),
            -(g_r * w2 * log_d).sum(),
        ]
    )
    return float(_huber(r, delta).sum()), grad


def grid_objectives(thetas: np.ndarray, log_n, log_d, log_l, delta: float = HUBER_DELTA):
    """The objective at every starting point at once: (S,)."""
    pred, _ = _log_pred(thetas, log_n, log_d)
    return _huber(pred - log_l[None, :], delta).sum(axis=1)


@dataclass
class _Best:
    theta: np.ndarray
    value: float
    converged: bool
    n_converged: int


def _lbfgs(starts: np.ndarray, log_n, log_d, log_l, delta: float) -> _Best:
    best: _Best | None = None
    n_conv = 0
    for x0 in starts:
        res = minimize(
            objective,
            x0,
            args=(log_n, log_d, log_l, delta),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-10},
        )
        # Convergence: scipy's own verdict, or a gradient small against the objective's scale
        # (the Huber objective is flat to ~1e-12 near a good optimum).
        grad_ok = float(np.max(np.abs(res.jac))) < 1e-6 * max(1.0, len(log_l) * delta)
        ok = bool(res.success or grad_ok) and bool(np.all(np.isfinite(res.x)))
        n_conv += ok
        cand = _Best(res.x, float(res.fun), ok, 0)
        if best is None or (ok, -cand.value) > (best.converged, -best.value):
            best = cand
    assert best is not None
    best.n_converged = n_conv
    return best


@dataclass
class FitResult:
    """The fitted law, the bootstrap refits and any findings about the fit's quality."""

    law: ScalingLaw
    objective: float
    converged: bool
    n_runs: int
    n_converged_starts: int
    boot: np.ndarray = field(default_factory=lambda: np.zeros((0, 5)))
    """Bootstrap thetas (n_boot, 5) as (a, b, e, alpha, beta)."""
    findings: list[Finding] = field(default_factory=list)

    def boot_laws(self) -> list[ScalingLaw]:
        return [ScalingLaw.from_theta(t) for t in self.boot]

    def band(self, params: Any, tokens: Any, level: float = 0.95) -> tuple[np.ndarray, ...]:
        """(loss, low, high) at the given points; the band is the bootstrap percentile interval."""
        n = np.atleast_1d(np.asarray(params, float))
        d = np.atleast_1d(np.asarray(tokens, float))
        n, d = np.broadcast_arrays(n, d)
        loss = self.law.predict(n, d)
        if len(self.boot) == 0:
            return loss, loss.copy(), loss.copy()
        logs, _ = _log_pred(self.boot, np.log(n), np.log(d))  # (n_boot, P)
        preds = np.exp(logs)
        q = (1.0 - level) / 2.0
        low, high = np.quantile(preds, [q, 1.0 - q], axis=0)
        return loss, low, high

    def predictions(self, points: list[tuple[float, float]], level: float = 0.95) -> list[dict]:
        if not points:
            return []
        n, d = zip(*points, strict=True)
        loss, low, high = self.band(n, d, level)
        return [
            {"params": float(p), "tokens": float(t), "loss": float(x), "low": float(lo),
             "high": float(hi)}
            for p, t, x, lo, hi in zip(n, d, loss, low, high, strict=True)
        ]


def _validate(params, tokens, losses) -> tuple[np.ndarray, ...]:
    n, d, loss = (np.asarray(x, float).ravel() for x in (params, tokens, losses))
    if not (len(n) == len(d) == len(loss)):
        raise BadInputError("params, tokens and losses differ in length", "give one row per run")
    bad = ~(np.isfinite(n) & np.isfinite(d) & np.isfinite(loss) & (n > 0) & (d > 0) & (loss > 0))
    if bad.any():
        raise BadInputError(
            f"{int(bad.sum())} runs have a non-positive or non-finite params, tokens or loss "
            f"(first at row {int(np.argmax(bad))})",
            "drop failed runs from the CSV before fitting",
        )
    if len(n) < 5:
        raise BadInputError(
            f"{len(n)} runs cannot identify 5 parameters",
            "run at least 5 (better 10 or more) gating runs; see `trainguard scale run`",
        )
    return n, d, loss


def _quality_findings(n, d, law: ScalingLaw) -> list[Finding]:
    out = []
    n_sizes, n_budgets = len(np.unique(n)), len(np.unique(d))
    if len(n) < 10 or n_sizes < 3 or n_budgets < 3:
        out.append(Finding.of(
            "E142",
            f"{len(n)} runs over {n_sizes} model sizes and {n_budgets} token budgets "
            "leave the fit poorly identified",
            data={"runs": len(n), "sizes": n_sizes, "budgets": n_budgets},
        ))
    for name in ("alpha", "beta"):
        v = getattr(law, name)
        if not 0.05 <= v <= 1.5:
            out.append(Finding.of(
                "E142", f"fitted {name}={v:.3g} is outside the plausible range [0.05, 1.5]",
                data={name: v},
            ))
    return out


def fit_scaling_law(
    params: Any,
    tokens: Any,
    losses: Any,
    *,
    delta: float = HUBER_DELTA,
    n_starts: int | None = 64,
    n_boot: int = 200,
    boot_starts: int = 4,
    seed: int = 0,
) -> FitResult:
    """Fit the law to runs (params N, tokens D, final loss L) and bootstrap it over runs."""
    n, d, loss = _validate(params, tokens, losses)
    log_n, log_d, log_l = np.log(n), np.log(d), np.log(loss)
    grid = init_grid()
    order = np.argsort(grid_objectives(grid, log_n, log_d, log_l, delta), kind="stable")
    starts = grid[order] if n_starts is None else grid[order[:n_starts]]
    best = _lbfgs(starts, log_n, log_d, log_l, delta)
    law = ScalingLaw.from_theta(best.theta)
    findings = []
    if not best.converged:
        findings.append(Finding.of(
            "E141", f"none of {len(starts)} L-BFGS starts converged (best objective "
            f"{best.value:.3g})", data={"starts": len(starts)},
        ))
    findings += _quality_findings(n, d, law)

    rng = np.random.default_rng(seed)
    boot = np.empty((n_boot, 5))
    for i in range(n_boot):
        idx = rng.integers(0, len(n), len(n))
        bn, bd, bl = log_n[idx], log_d[idx], log_l[idx]
        top = np.argsort(grid_objectives(grid, bn, bd, bl, delta))[:boot_starts]
        b = _lbfgs(np.vstack([best.theta[None, :], grid[top]]), bn, bd, bl, delta)
        boot[i] = b.theta
    return FitResult(
        law=law,
        objective=best.value,
        converged=best.converged,
        n_runs=len(n),
        n_converged_starts=best.n_converged,
        boot=boot,
        findings=findings,
    )


def read_runs_csv(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(params, tokens, loss) from a CSV with at least those three columns."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"runs CSV {path} does not exist", "give the CSV `scale run` wrote")
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"params", "tokens", "loss"} - set(reader.fieldnames or [])
        if missing:
            raise BadInputError(
                f"{path} lacks columns {sorted(missing)} (has {reader.fieldnames})",
                "the CSV needs a header with params,tokens,loss",
            )
        rows = []
        for i, row in enumerate(reader, start=2):
            try:
                rows.append((float(row["params"]), float(row["tokens"]), float(row["loss"])))
            except (TypeError, ValueError):
                raise BadInputError(
                    f"{path} line {i}: params, tokens and loss must be numbers, got {row}",
                    "fix or delete that line",
                ) from None
    if not rows:
        raise BadInputError(f"{path} has no runs", "run `trainguard scale run` first")
    arr = np.array(rows)
    return arr[:, 0], arr[:, 1], arr[:, 2]
