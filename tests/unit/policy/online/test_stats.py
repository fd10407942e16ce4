"""Shared statistics: the values the canary judge and the knob experiment rely on."""

from __future__ import annotations

import hashlib
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.policy.online.stats import mean_var, stable_hash64

pytestmark = pytest.mark.unit


@given(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=50))
def test_mean_var_matches_the_standard_library(xs: list[float]) -> None:
    mean, var = mean_var(xs)
    assert mean == pytest.approx(statistics.fmean(xs), abs=1e-9)
    assert var == pytest.approx(statistics.variance(xs), rel=1e-9, abs=1e-9)


def test_mean_var_of_one_value_has_no_spread() -> None:
    assert mean_var([2.5]) == (2.5, 0.0)


def test_stable_hash64_is_sha256_of_the_nul_joined_parts() -> None:
    want = int.from_bytes(hashlib.sha256(b"job\0cohort\0arm").digest()[:8], "big")
    assert stable_hash64("job", "cohort", "arm") == want
    assert stable_hash64("job\0cohort", "arm") == want  # the join is the whole key
    assert 0 <= stable_hash64("x") < 2**64
