"""The one recency rule the findings and the retrain share (dynamiccl/api/recency.py)."""

from __future__ import annotations

import pytest

from dynamiccl.api.recency import still_holds


def test_a_choice_stops_holding_when_one_of_the_latest_verdicts_contradicts_it() -> None:
    six_then_one = [True] * 6 + [False]
    assert still_holds([True] * 6, 2)
    assert not still_holds(six_then_one, 2)  # however many older jobs supported it
    assert not still_holds([*six_then_one, True], 2)  # one new supporter is not enough
    assert still_holds([*six_then_one, True, True], 2)  # the latest two confirm it again
    assert still_holds([False, True], 1)  # with one latest verdict, only it counts


def test_a_non_positive_window_is_refused() -> None:
    with pytest.raises(ValueError, match="latest must be positive"):
        still_holds([True], 0)
