"""A batched L-BFGS: many independent small problems minimised together in numpy.

The scaling-law fit runs L-BFGS from thousands of starting points and then again for every
bootstrap resample. Each problem has 5 parameters and a few dozen runs, so one scipy call per
problem spends its time in Python overhead. Here every problem keeps its own history, line
search and convergence test (nothing is shared between problems, so each follows the path a
lone L-BFGS would), but one numpy call evaluates all of them at once.

Algorithm: Nocedal and Wright (2006), algorithm 7.4 (two-loop recursion, memory m) with a
backtracking Armijo line search; a curvature pair is stored only when s.y > 0, and a problem
whose direction is not a descent direction restarts from steepest descent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# fg(x: (K, n), which: (K,) problem indices) -> (f: (K,), g: (K, n)); `which` lets problems
# carry their own data (bootstrap resamples).
BatchedObjective = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass
class BatchResult:
    x: np.ndarray  # (P, n)
    f: np.ndarray  # (P,)
    g: np.ndarray  # (P, n)
    converged: np.ndarray  # (P,) bool
    iterations: int


def minimize_batched(
    fg: BatchedObjective,
    x0: np.ndarray,
    *,
    memory: int = 10,
    max_iter: int = 1000,
    gtol: float = 1e-12,
    ftol: float = 1e-14,
    c1: float = 1e-4,
    max_halvings: int = 40,
) -> BatchResult:
    """Minimise P independent problems from x0 (P, n).

    A problem converges when its largest gradient component is below `gtol`, or when an
    iteration lowers its objective by at most `ftol * max(1, |f|)` (scipy's relative-reduction
    test), or when no step along a descent direction lowers it any more (a minimum to machine
    precision). Problems that hit `max_iter` are reported as not converged.
    """
    x = np.array(x0, dtype=float, copy=True)
    p, n = x.shape
    f, g = fg(x, np.arange(p))
    s_hist = np.zeros((p, memory, n))
    y_hist = np.zeros((p, memory, n))
    rho = np.zeros((p, memory))  # 0 marks an empty slot: it then contributes nothing
    slot = np.zeros(p, dtype=int)
    n_pairs = np.zeros(p, dtype=int)
    active = np.ones(p, dtype=bool)
    converged = np.zeros(p, dtype=bool)
    iterations = 0
    for _ in range(max_iter):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        iterations += 1
        gi = g[idx]
        d = _two_loop(gi, s_hist[idx], y_hist[idx], rho[idx], slot[idx], n_pairs[idx])
        slope = np.einsum("pn,pn->p", gi, d)
        bad = ~(slope < 0) | ~np.isfinite(slope)
        if bad.any():  # not a descent direction: forget the history, go downhill
            d[bad] = -gi[bad]
            rho[idx[bad]] = 0.0
            n_pairs[idx[bad]] = 0
            slope[bad] = -np.einsum("pn,pn->p", gi[bad], gi[bad])
        # First step of a fresh history: unit length, as scipy does (1 / ||g||).
        fresh = n_pairs[idx] == 0
        step = np.where(fresh, 1.0 / np.maximum(np.linalg.norm(d, axis=1), 1e-300), 1.0)
        fi = f[idx]
        accepted = np.zeros(idx.size, dtype=bool)
        x_new, f_new, g_new = x[idx].copy(), fi.copy(), gi.copy()
        for _ in range(max_halvings):
            todo = np.flatnonzero(~accepted)
            if todo.size == 0:
                break
            trial = x[idx[todo]] + step[todo, None] * d[todo]
            ft, gt = fg(trial, idx[todo])
            ok = np.isfinite(ft) & (ft <= fi[todo] + c1 * step[todo] * slope[todo])
            hit = todo[ok]
            x_new[hit], f_new[hit], g_new[hit] = trial[ok], ft[ok], gt[ok]
            accepted[hit] = True
            step[todo[~ok]] *= 0.5
        # No acceptable step along a descent direction: a minimum to machine precision.
        stuck = idx[~accepted]
        active[stuck] = False
        converged[stuck] = True
        acc = idx[accepted]
        s = x_new[accepted] - x[acc]
        y = g_new[accepted] - g[acc]
        sy = np.einsum("pn,pn->p", s, y)
        keep = sy > 1e-300
        k = acc[keep]
        sl = slot[k]
        s_hist[k, sl], y_hist[k, sl], rho[k, sl] = s[keep], y[keep], 1.0 / sy[keep]
        slot[k] = (sl + 1) % memory
        n_pairs[k] = np.minimum(n_pairs[k] + 1, memory)
        decrease = f[acc] - f_new[accepted]
        x[acc], f[acc], g[acc] = x_new[accepted], f_new[accepted], g_new[accepted]
        done = (np.abs(g[acc]).max(axis=1) < gtol) | (
            decrease <= ftol * np.maximum(1.0, np.abs(f[acc]))
        )
        active[acc[done]] = False
        converged[acc[done]] = True
    return BatchResult(x=x, f=f, g=g, converged=converged, iterations=iterations)


def _two_loop(g, s_hist, y_hist, rho, slot, n_pairs) -> np.ndarray:
    """-H g for each problem from its (s, y) history, newest pair first (Nocedal-Wright 7.4)."""
    p, m, _ = s_hist.shape
    q = g.copy()
    alphas = np.zeros((p, m))
    rows = np.arange(p)
    for j in range(1, m + 1):  # newest to oldest
        sl = (slot - j) % m
        a = rho[rows, sl] * np.einsum("pn,pn->p", s_hist[rows, sl], q)
        alphas[:, j - 1] = a
        q -= a[:, None] * y_hist[rows, sl]
    newest = (slot - 1) % m
    s_new, y_new = s_hist[rows, newest], y_hist[rows, newest]
    yy = np.einsum("pn,pn->p", y_new, y_new)
    gamma = np.where(
        (n_pairs > 0) & (yy > 0),
        np.einsum("pn,pn->p", s_new, y_new) / np.where(yy > 0, yy, 1.0),
        1.0,
    )
    r = gamma[:, None] * q
    for j in range(m, 0, -1):  # oldest to newest
        sl = (slot - j) % m
        b = rho[rows, sl] * np.einsum("pn,pn->p", y_hist[rows, sl], r)
        r += (alphas[:, j - 1] - b)[:, None] * s_hist[rows, sl]
    return -r
