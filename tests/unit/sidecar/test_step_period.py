"""The period of one communicator's calls (sidecar/step_period.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamiccl.sidecar.step_period import LOST, find_period, match_fractions, token


def _timed(tokens: list[int], gaps: list[int], jitter: float = 0.01, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    t, out = 0, []
    for i in range(len(tokens)):
        out.append(t)
        t += int(gaps[i % len(gaps)] * rng.lognormvariate(0.0, jitter))
    return out


def test_a_step_after_warm_up_is_found_from_its_first_call() -> None:
    step = [token(4, s) for s in (1 << 20, 25 << 20, 26 << 20, 8)]
    warm = [token(0, 250 << 20)] * 5 + [token(4, 30 << 20)] * 3
    toks = warm + step * 6
    gaps = [1000] * 3 + [50_000]  # the long quiet time follows the 8-byte call
    starts = _timed(toks, [1000] * len(warm) + gaps * 6)
    p = find_period(toks, starts)
    assert p is not None
    assert p.template == tuple(step)  # begins with the call after the quiet time
    assert toks[p.offset] == step[0]
    assert p.offset >= len(warm)
    assert p.cycle_ns == pytest.approx(53_000, rel=0.05)


def test_calls_that_all_look_alike_are_split_into_steps_by_their_timing() -> None:
    toks = [token(4, 1 << 24)] * (16 * 8)
    gaps = [500] * 7 + [20_000]  # 8 alike calls per step, then the optimizer
    p = find_period(toks, _timed(toks, [0] * 0 + gaps))
    assert p is not None
    assert p.calls == 8


def test_a_sub_step_that_repeats_is_not_taken_for_the_step() -> None:
    layer = [token(4, 64 << 20), token(4, 48 << 20), token(4, 32 << 20)]
    step = layer * 6 + [token(4, 8)]
    toks = step * 6
    gaps = [1000] * (len(step) - 1) + [80_000]
    p = find_period(toks, _timed(toks, gaps))
    assert p is not None
    assert p.calls == len(step)


def test_an_extra_call_every_few_steps_is_skipped() -> None:
    step = [token(4, s << 20) for s in range(1, 9)]
    toks, gaps = [], []
    for k in range(16):
        toks += step
        gaps += [1000] * 7 + [30_000]
        if k % 4 == 3:
            toks.append(token(4, 64))
            gaps.append(1000)
    starts, t = [], 0
    for g in gaps:
        starts.append(t)
        t += g
    p = find_period(toks, starts)
    assert p is not None
    assert p.template == tuple(step)
    assert 0 < p.extra_rate < 0.05


def test_random_sizes_have_no_period() -> None:
    rng = random.Random(3)
    toks = [token(rng.choice((2, 3, 4)), 1 << rng.randrange(10, 28)) for _ in range(3000)]
    assert find_period(toks, _timed(toks, [1000])) is None


def test_match_fractions_estimate_the_share_of_equal_calls() -> None:
    toks = [token(4, 1), token(4, 2), token(4, 3)] * 200
    f = match_fractions(toks, 6)
    assert f[3] == pytest.approx(1.0, abs=1e-6)
    assert f[6] == pytest.approx(1.0, abs=1e-6)
    assert f[1] < 0.2
    assert f[2] < 0.2


def test_lengths_must_agree() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        find_period([1, 2, 3], [0, 1])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from([token(4, 8), token(2, 1 << 20), token(3, 1 << 20), LOST]), max_size=300
    ),
    st.integers(1, 5000),
)
def test_any_sequence_gives_a_period_that_its_calls_repeat_or_none(
    toks: list[int], gap: int
) -> None:
    starts = [i * gap for i in range(len(toks))]
    p = find_period(toks, starts)
    if p is not None:
        n = p.calls
        assert 1 <= n <= len(toks) // 3
        assert tuple(toks[p.offset : p.offset + n]) == p.template or LOST in toks
