"""Simultaneous intervals: the budget split over quantities and looks, and what it buys."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from dynamiccl.policy.online.sequential import simultaneous_t, t_quantile, welch_df


def test_student_t_quantiles_match_the_tables() -> None:
    for p, df, ref in ((0.975, 1, 12.7062), (0.975, 5, 2.5706), (0.95, 10, 1.8125),
                       (0.999, 3, 10.2145), (0.975, 1000, 1.9623)):  # fmt: skip
        assert t_quantile(p, df) == pytest.approx(ref, abs=1e-4)
    with pytest.raises(ValueError, match=r"need 0\.5 < p < 1"):
        t_quantile(0.4, 3)


def test_the_budget_is_split_over_quantities_and_sample_counts() -> None:
    # n = 1, k = 1: alpha 0.05 * 6 / pi^2 = 0.0304, two-sided; df large: the normal 2.1649
    assert simultaneous_t(1, 1e6) == pytest.approx(2.1649, abs=1e-3)
    assert simultaneous_t(5, 8) < simultaneous_t(5, 8, k=3) < simultaneous_t(40, 8, k=3)
    assert simultaneous_t(10, 8, alpha=0.01) > simultaneous_t(10, 8, alpha=0.05)
    assert simultaneous_t(10, 3) > simultaneous_t(10, 30)  # few jobs: a wider interval
    for bad in ({"n": 0}, {"n": 3, "k": 0}, {"n": 3, "alpha": 1.0}):
        with pytest.raises(ValueError, match="need n >= 1"):
            simultaneous_t(df=5, **bad)


def test_welch_degrees_of_freedom() -> None:
    assert welch_df(0.01, 5, 0.01, 5) == pytest.approx(8.0)  # equal sides: n_a + n_b - 2
    assert welch_df(0.01, 5, 0.0, 0) == pytest.approx(4.0)  # against a constant: n - 1
    assert welch_df(0.0, 3, 0.0, 3) == pytest.approx(4.0)  # no spread at all


def _ever_excludes(z_of: Callable[[int], float], rng: random.Random, looks: int = 200) -> bool:
    """Does a running mean's interval ever exclude the true mean 0 over `looks` samples?"""
    total = 0.0
    for n in range(1, looks + 1):
        total += rng.gauss(0.0, 1.0)
        if abs(total / n) > z_of(n) / math.sqrt(n):
            return True
    return False


def test_looking_after_every_sample_stays_within_the_budget() -> None:
    rng = random.Random(11)
    histories = 2000
    fixed = sum(_ever_excludes(lambda n: 1.96, rng) for _ in range(histories)) / histories
    sim: float = sum(
        _ever_excludes(lambda n: simultaneous_t(n, 1e6), rng) for _ in range(histories)
    )
    sim /= histories
    assert fixed > 0.25  # a fixed 95 % interval, looked at 200 times
    # at most the 5 % budget, give or take three standard errors of 2000 histories
    assert sim <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / histories)
