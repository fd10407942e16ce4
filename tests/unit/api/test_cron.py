"""Cron schedules in UTC (cronsim underneath; the @macros are ours)."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.api.cron import CronError, fired_since, next_after, validate

T0 = dt.datetime(2025, 3, 14, 10, 30, 15, tzinfo=dt.UTC)  # a Friday


def nxt(expr: str, t: dt.datetime = T0) -> dt.datetime:
    return next_after(expr, t)


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("@hourly", dt.datetime(2025, 3, 14, 11, 0, tzinfo=dt.UTC)),
        ("@daily", dt.datetime(2025, 3, 15, 0, 0, tzinfo=dt.UTC)),
        ("@weekly", dt.datetime(2025, 3, 16, 0, 0, tzinfo=dt.UTC)),  # Sunday
        ("@monthly", dt.datetime(2025, 4, 1, 0, 0, tzinfo=dt.UTC)),
        ("@yearly", dt.datetime(2026, 1, 1, 0, 0, tzinfo=dt.UTC)),
        ("*/15 * * * *", dt.datetime(2025, 3, 14, 10, 45, tzinfo=dt.UTC)),
        ("31 10 * * *", dt.datetime(2025, 3, 14, 10, 31, tzinfo=dt.UTC)),
        ("30 10 * * *", dt.datetime(2025, 3, 15, 10, 30, tzinfo=dt.UTC)),
        ("0 2 * * mon-wed", dt.datetime(2025, 3, 17, 2, 0, tzinfo=dt.UTC)),
        ("0 0 * * 7", dt.datetime(2025, 3, 16, 0, 0, tzinfo=dt.UTC)),
        ("0 0 1 jan,jul *", dt.datetime(2025, 7, 1, 0, 0, tzinfo=dt.UTC)),
        ("0 0 29 2 *", dt.datetime(2028, 2, 29, 0, 0, tzinfo=dt.UTC)),
        # day-of-month OR day-of-week when both are restricted
        ("0 0 20 * 6", dt.datetime(2025, 3, 15, 0, 0, tzinfo=dt.UTC)),
        ("0 9-17/4 * * *", dt.datetime(2025, 3, 14, 13, 0, tzinfo=dt.UTC)),
    ],
)
def test_next_after(expr: str, want: dt.datetime) -> None:
    assert nxt(expr) == want


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "* * * *",
        "60 * * * *",
        "* 24 * * *",
        "*/0 * * * *",
        "5-1 * * * *",
        "x * * * *",
        "@often",
    ],
)
def test_bad_expressions(expr: str) -> None:
    with pytest.raises(CronError, match="invalid cron schedule"):
        validate(expr)


@pytest.mark.parametrize("expr", ["0 0 30 2 *", "0 0 31 2 *", "0 0 31 4,6,9,11 *"])
def test_never_firing_schedule_is_an_error(expr: str) -> None:
    with pytest.raises(CronError, match="day-of-month"):
        validate(expr)


def test_fired_since() -> None:
    t = T0.timestamp()
    assert not fired_since("@daily", t, t + 3600)
    assert fired_since("@daily", t, t + 86_400)


@given(st.datetimes(min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2100, 1, 1)))
def test_next_is_strictly_later_and_matches(t: dt.datetime) -> None:
    t = t.replace(tzinfo=dt.UTC)
    n = next_after("7 */3 * * 1-5", t)
    assert n > t
    assert (n.minute, n.hour % 3, n.isoweekday() <= 5) == (7, 0, True)
    assert n - t <= dt.timedelta(days=3, hours=3)
