"""Per-arm statistics of log-times and the pooled noise estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynamiccl.policy.online.bandit import ArmStats, BanditConfig, pooled_noise_sd


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
