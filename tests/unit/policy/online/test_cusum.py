"""CUSUM: silent under noise, quick on a real shift."""

from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.policy.online.cusum import Cusum, CusumConfig


def _run(values: np.ndarray, ref: float, sd: float) -> int | None:
    c = Cusum(CusumConfig())
    for i, v in enumerate(values):
        if c.update(float(v), ref, sd):
            return i
    return None


def test_no_alarm_on_stationary_noise() -> None:
    rng = np.random.default_rng(1)
    alarms = sum(_run(rng.normal(0, 0.04, 300), 0.0, 0.04) is not None for _ in range(50))
    # Two-sided in-control run length ~9500 samples: ~1.6 alarms expected in 15000.
    assert alarms <= 5


@pytest.mark.parametrize("shift", [0.1, -0.1, 0.3])
def test_alarm_soon_after_a_shift(shift: float) -> None:
    rng = np.random.default_rng(2)
    values = np.concatenate([rng.normal(0, 0.04, 100), rng.normal(shift, 0.04, 100)])
    at = _run(values, 0.0, 0.04)
    assert at is not None
    assert 100 <= at <= 115


def test_resets_after_alarm_and_rejects_bad_sd() -> None:
    c = Cusum(CusumConfig(warmup=0, h=1.0))
    assert c.update(10.0, 0.0, 1.0)
    assert c.pos == 0.0
    assert c.seen == 0
    with pytest.raises(ValueError, match="sd"):
        c.update(0.0, 0.0, 0.0)
