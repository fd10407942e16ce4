"""The guardrail needs evidence before reverting, and reverts on a real regression."""

from __future__ import annotations

import numpy as np

from dynamiccl.policy.online.bandit import ArmStats
from dynamiccl.policy.online.guardrail import GuardrailConfig, beats, regression, trips


def _arm(values: np.ndarray) -> ArmStats:
    a = ArmStats()
    for v in values:
        a.add(float(v))
    return a


def test_trips_on_clear_regression() -> None:
    rng = np.random.default_rng(0)
    default = _arm(np.log(rng.normal(100, 4, 20)))
    worse = _arm(np.log(rng.normal(110, 4.4, 20)))
    cfg = GuardrailConfig(threshold=0.02)
    assert trips(worse, default, 0.04, cfg)
    assert not beats(worse, default, 0.04, cfg)
    r = regression(worse, default)
    assert r is not None
    assert 0.05 < r < 0.15


def test_no_trip_within_threshold_or_without_evidence() -> None:
    rng = np.random.default_rng(1)
    default = _arm(np.log(rng.normal(100, 4, 30)))
    close = _arm(np.log(rng.normal(101, 4, 30)))
    cfg = GuardrailConfig(threshold=0.02)
    assert not trips(close, default, 0.04, cfg)
    few = _arm(np.log(np.array([130.0, 131.0])))
    assert not trips(few, default, 0.04, cfg)  # below min_samples
    assert regression(ArmStats(), default) is None


def test_beats_needs_evidence() -> None:
    rng = np.random.default_rng(2)
    default = _arm(np.log(rng.normal(100, 4, 30)))
    better = _arm(np.log(rng.normal(80, 3.2, 30)))
    tiny = _arm(np.log(rng.normal(99.5, 4, 30)))
    cfg = GuardrailConfig()
    assert beats(better, default, 0.04, cfg)
    assert not beats(tiny, default, 0.04, cfg)
