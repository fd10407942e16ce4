"""Intervals for decisions that are re-taken as evidence accumulates.

The learning loop looks at the same comparison again after every few jobs (a
canary against the promoted model, an env-knob value against the declared
default). A fixed 95 % interval would, over enough looks, exclude the truth
by chance, and a verdict taken then is wrong: with a look after every pair of
jobs, a canary no better than the promoted model was promoted or rolled back
in 41 % of simulated 60-job histories (benchmarks/canary_judge_bench.py).

`simultaneous_t` splits the error budget `alpha` over `k` quantities and over
every sample count n (alpha * 6 / (pi^2 n^2), which sums to alpha over n = 1,
2, ...): a union bound, so with probability 1 - alpha no interval is ever
wrong, at any look, as long as each look has a sample count of its own. The
callers count looks by the jobs of the rarer side (the canary, the knob value
under test): the other side grows faster and moves the comparison less, so
this is not a strict bound; the benchmarks measure what it gives. The quantile
is Student's t with Welch's degrees of freedom: the spread is estimated from
a handful of jobs, and the normal quantile would be too narrow there.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

_EPS = 1e-14


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                    -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):  # fmt: skip
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom (t >= 0)."""
    return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, for p in (0.5, 1) (bisection on the tail)."""
    if not 0.5 < p < 1.0 or df <= 0:
        raise ValueError(f"need 0.5 < p < 1 and df > 0 (got p={p}, df={df})")
    tail = 1.0 - p
    lo, hi = 0.0, max(1.0, NormalDist().inv_cdf(p))
    while t_sf(hi, df) > tail:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_sf(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * hi:
            break
    return (lo + hi) / 2.0


def welch_df(se2_a: float, n_a: int, se2_b: float, n_b: int) -> float:
    """Welch-Satterthwaite degrees of freedom of a difference of two means.

    `se2_*` are squared standard errors; a side with no jobs (n 0, se2 0) is a
    known constant (e.g. NCCL's default, speedup 1).
    """
    num = (se2_a + se2_b) ** 2
    den = sum(s * s / (n - 1) for s, n in ((se2_a, n_a), (se2_b, n_b)) if n > 1 and s > 0)
    if den <= 0.0:
        return float(max(1, n_a + n_b - 2))
    return max(1.0, num / den)


def _spent(n: int, k: int, alpha: float) -> float:
    if n < 1 or k < 1 or not 0.0 < alpha < 1.0:
        raise ValueError(f"need n >= 1, k >= 1, 0 < alpha < 1 (got n={n}, k={k}, alpha={alpha})")
    return alpha / k * 6.0 / (math.pi**2 * n * n)


def simultaneous_t(n: int, df: float, k: int = 1, alpha: float = 0.05) -> float:
    """Quantile of a two-sided interval for one of `k` quantities at sample count `n`."""
    return t_quantile(1.0 - _spent(n, k, alpha) / 2.0, df)


def simultaneous_z(n: int, k: int = 1, alpha: float = 0.05) -> float:
    """The same with the normal quantile: for a spread known well enough (or a cheap error)."""
    return NormalDist().inv_cdf(1.0 - _spent(n, k, alpha) / 2.0)
