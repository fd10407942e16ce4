"""A small deterministic Nelder-Mead minimiser over box-bounded parameters.

No SciPy dependency: the calibration problem has ~15 parameters and a cheap,
vectorised objective, so a plain simplex search with restarts is enough.
Parameters are optimised in an unbounded space and mapped into their bounds
with a logistic function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def to_box(u: F64, lo: F64, hi: F64) -> F64:
    """Unbounded -> [lo, hi]."""
    out: F64 = lo + (hi - lo) * 0.5 * (1.0 + np.tanh(0.5 * u))  # logistic, overflow-free
    return out


def from_box(x: F64, lo: F64, hi: F64) -> F64:
    """[lo, hi] -> unbounded (inverse of `to_box`)."""
    z = np.clip((x - lo) / (hi - lo), 1e-6, 1 - 1e-6)
    out: F64 = np.log(z / (1 - z))
    return out


def nelder_mead(
    f: Callable[[F64], float],
    x0: Sequence[float],
    *,
    step: float = 0.6,
    max_evals: int = 6000,
    tol: float = 1e-10,
    restarts: int = 3,
) -> tuple[F64, float]:
    """Minimise `f` from `x0`; returns (x, f(x)). Deterministic."""
    best = np.asarray(x0, dtype=np.float64)
    best_f = f(best)
    for _ in range(restarts):
        x, fx = _simplex(f, best, step, max_evals, tol)
        improved = fx < best_f - 1e-7 * (abs(best_f) + 1e-12)
        if fx < best_f:
            best, best_f = x, fx
        if not improved:
            break
    return best, best_f


def _simplex(
    f: Callable[[F64], float], x0: F64, step: float, max_evals: int, tol: float
) -> tuple[F64, float]:
    n = x0.size
    pts = [x0.copy()]
    for i in range(n):
        p = x0.copy()
        p[i] += step
        pts.append(p)
    simplex = np.array(pts)
    values = np.array([f(p) for p in simplex])
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(values)
        simplex, values = simplex[order], values[order]
        if abs(values[-1] - values[0]) <= tol * (abs(values[0]) + tol):
            break
        centroid = simplex[:-1].mean(axis=0)
        worst = simplex[-1]
        xr = centroid + (centroid - worst)
        fr = f(xr)
        evals += 1
        if values[0] <= fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
            continue
        if fr < values[0]:
            xe = centroid + 2.0 * (centroid - worst)
            fe = f(xe)
            evals += 1
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
            continue
        xc = centroid + 0.5 * (worst - centroid)
        fc = f(xc)
        evals += 1
        if fc < values[-1]:
            simplex[-1], values[-1] = xc, fc
            continue
        for i in range(1, n + 1):
            simplex[i] = simplex[0] + 0.5 * (simplex[i] - simplex[0])
            values[i] = f(simplex[i])
        evals += n
    i = int(np.argmin(values))
    return simplex[i], float(values[i])
