"""Deterministic exploration schedules: same inputs, same choice, on every rank."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.policy.schedule import (
    WEIGHT_ONE,
    call_hash,
    check_weights,
    choose,
    pick,
    splitmix64,
    to_fixed_point,
)

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)


def test_splitmix64_known_values() -> None:
    # Reference values of splitmix64 seeded with 0 (first two outputs of the
    # published generator: state += golden; mix(state)).
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


@given(U64, U64, st.integers(0, 1 << 20), st.integers(0, 1 << 40))
def test_hash_is_a_pure_function(seed: int, comm: int, bucket: int, i: int) -> None:
    assert call_hash(seed, comm, bucket, i) == call_hash(seed, comm, bucket, i)
    assert 0 <= call_hash(seed, comm, bucket, i) < (1 << 64)


def test_schedule_is_identical_in_separate_processes() -> None:
    """Two 'ranks' (fresh interpreters, different hash seeds) compute the same sequence."""
    code = (
        "from dynamiccl.policy.schedule import choose, to_fixed_point;"
        "w = to_fixed_point([0.5, 0.2, 0.2, 0.1]);"
        "print(','.join(str(choose(42, 0xABCDEF, 17, i, w)) for i in range(2000)))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(s)},
        ).stdout
        for s in (1, 2, 3)
    }
    assert len(outs) == 1
    local = ",".join(
        str(choose(42, 0xABCDEF, 17, i, to_fixed_point([0.5, 0.2, 0.2, 0.1]))) for i in range(2000)
    )
    assert outs.pop().strip() == local


def test_schedule_differs_across_comms_and_seeds() -> None:
    w = to_fixed_point([0.25] * 4)
    a = [choose(1, 7, 3, i, w) for i in range(256)]
    b = [choose(1, 8, 3, i, w) for i in range(256)]
    c = [choose(2, 7, 3, i, w) for i in range(256)]
    assert a != b
    assert a != c


def test_frequencies_follow_the_weights() -> None:
    probs = [0.6, 0.25, 0.1, 0.05]
    w = to_fixed_point(probs)
    n = 40_000
    counts = Counter(choose(9, 1, 2, i, w) for i in range(n))
    for k, p in enumerate(probs):
        assert abs(counts[k] / n - p) < 0.01


def test_zero_weight_is_never_chosen() -> None:
    w = to_fixed_point([0.5, 0.0, 0.5])
    assert all(choose(3, 4, 5, i, w) != 1 for i in range(5000))


def test_pick_boundaries() -> None:
    w = (1, WEIGHT_ONE - 1)
    assert pick(w, 0) == 0
    assert pick(w, 1 << 48) == 1
    assert pick(w, (1 << 64) - 1) == 1


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=32))
def test_fixed_point_sums_exactly(probs: list[float]) -> None:
    w = to_fixed_point(probs)
    check_weights(w)
    assert len(w) == len(probs)
    total = sum(probs)
    if total > 0:
        for p, q in zip(probs, w, strict=True):
            assert abs(q - p / total * WEIGHT_ONE) <= 1.0


@pytest.mark.parametrize("bad", [[], [-1.0, 2.0], [float("nan")], [float("inf"), 1.0]])
def test_fixed_point_rejects_bad_input(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="probs"):
        to_fixed_point(bad)


@pytest.mark.parametrize("bad", [[], [WEIGHT_ONE, -1, 1], [1, 2]])
def test_check_weights_rejects(bad: list[int]) -> None:
    with pytest.raises(ValueError, match="weights"):
        check_weights(bad)
