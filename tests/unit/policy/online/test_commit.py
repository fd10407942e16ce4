"""What a cell's tuner commits: the escape from an arm a look measured far slower."""

from __future__ import annotations

from dynamiccl.policy.online.commit import escape, final_choice
from dynamiccl.policy.online.race import RaceConfig
from tests.unit.policy.online.test_race import stats


def test_a_look_twice_as_fast_escapes_the_final_rules_leader() -> None:
    """NCCL's pick measured 16 times at 200 us, a look once at 100 us: the final choice's
    rule keeps the pick (the look has fewer than `final_calls` calls); the escape takes
    the look, which no luck in 4 % noise explains."""
    st = stats([200.0, 204.0, 196.0, 201.0] * 4, [100.0], [])
    every, cfg = [True] * 3, RaceConfig()
    lead = final_choice(st, every, 0.04, cfg)
    assert lead == 0
    assert escape(st, every, 0.04, cfg, lead) == 1


def test_a_look_a_little_faster_does_not_escape() -> None:
    """3 % faster on one call is within the noise: the well-measured leader stays."""
    st = stats([200.0, 204.0, 196.0, 201.0] * 4, [194.0])
    assert escape(st, [True, True], 0.04, RaceConfig(), 0) == 0
    assert escape(st, [True, True], 0.04, RaceConfig(), None) is None


def test_an_ineligible_look_does_not_escape() -> None:
    st = stats([200.0] * 16, [100.0])
    assert escape(st, [True, False], 0.04, RaceConfig(), 0) == 0
