"""Gaussian Thompson sampling on log-times."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynamiccl.policy.online.bandit import (
    ArmStats,
    BanditConfig,
    Posterior,
    best_probabilities,
    leader,
    pooled_noise_sd,
    posteriors,
)


def _arm(values: list[float]) -> ArmStats:
    a = ArmStats()
    for v in values:
        a.add(v)
    return a


def test_arm_stats_moments() -> None:
    a = _arm([1.0, 2.0, 3.0])
    assert a.n == 3
    assert a.mean == pytest.approx(2.0)
    assert a.sum_sq_dev == pytest.approx(2.0)
    assert math.isnan(ArmStats().mean)


def test_pooled_noise_tends_to_the_sample_sd() -> None:
    rng = np.random.default_rng(0)
    arms = [_arm(list(rng.normal(m, 0.04, 400))) for m in (0.0, 1.0, 2.0)]
    assert pooled_noise_sd(arms, BanditConfig()) == pytest.approx(0.04, rel=0.05)
    # Without samples the prior guess stands.
    assert pooled_noise_sd([ArmStats()], BanditConfig(noise_sd=0.07)) == pytest.approx(0.07)


def test_posterior_shrinks_and_concentrates() -> None:
    cfg = BanditConfig(prior_sd=0.25, noise_sd=0.05)
    arms = [_arm([1.0] * 50), ArmStats()]
    post = posteriors(arms, cfg, prior_means=[0.0, None])
    assert post[0].mean == pytest.approx(1.0, abs=0.01)  # data dominate the prior
    assert post[0].sd < 0.01
    assert post[1].mean == pytest.approx(1.0)  # unseen arm: grand mean
    assert post[1].sd == pytest.approx(0.25)


def test_best_probabilities_deterministic_and_sensible() -> None:
    post = [Posterior(0.0, 0.01, 10), Posterior(0.1, 0.01, 10), Posterior(0.0, 0.5, 0)]
    p1 = best_probabilities(post, seed=5)
    p2 = best_probabilities(post, seed=5)
    assert p1 == p2
    assert sum(p1) == pytest.approx(1.0)
    assert p1[1] < 0.01  # clearly slower arm
    assert 0.3 < p1[2] < 0.7  # uncertain arm keeps being explored
    p3 = best_probabilities(post, seed=5, eligible=[False, True, True])
    assert p3[0] == 0.0


def test_no_eligible_arm_is_an_error() -> None:
    post = [Posterior(0.0, 0.1, 1)]
    with pytest.raises(ValueError, match="eligible"):
        best_probabilities(post, 1, eligible=[False])
    with pytest.raises(ValueError, match="eligible"):
        leader(post, eligible=[False])


def test_leader_is_lowest_mean_with_index_tiebreak() -> None:
    post = [Posterior(1.0, 0.1, 1), Posterior(0.5, 0.1, 1), Posterior(0.5, 0.1, 1)]
    assert leader(post) == 1
    assert leader(post, eligible=[True, False, True]) == 2
