"""Cron schedules (5 fields or @macros), evaluated in UTC — for the policy's retraining schedule.

Fields: minute hour day-of-month month day-of-week, each `*`, `N`, `A-B`,
`*/S`, `A-B/S` or a comma list of those; months and weekdays also by 3-letter
name; weekday 0 and 7 are Sunday. As in classic cron, when both day-of-month
and day-of-week are restricted a day matches if either does.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Final

MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS: Final = [
    "jan",
    "feb",
    "mar",
    "apr",
    "may",
    "jun",
    "jul",
    "aug",
    "sep",
    "oct",
    "nov",
    "dec",
]
_DAYS: Final = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_RANGES: Final = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_NAMES: Final = (
    None,
    None,
    None,
    {n: i + 1 for i, n in enumerate(_MONTHS)},
    dict(zip(_DAYS, range(7), strict=True)),
)
MAX_SEARCH_DAYS: Final = 366 * 5


class CronError(ValueError):
    """A malformed cron expression; the message names the field."""


def _value(text: str, field: int) -> int:
    names = _NAMES[field]
    low = text.lower()
    if names is not None and low in names:
        return names[low]
    if not text.isdigit():
        raise CronError(f"field {field + 1}: {text!r} is not a number")
    return int(text)


def _field(text: str, field: int) -> tuple[frozenset[int], bool]:
    lo, hi = _RANGES[field]
    out: set[int] = set()
    for part in text.split(","):
        rng, _, step_s = part.partition("/")
        step = _value(step_s, field) if step_s else 1
        if step < 1:
            raise CronError(f"field {field + 1}: step must be >= 1")
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            a_s, b_s = rng.split("-", 1)
            a, b = _value(a_s, field), _value(b_s, field)
        else:
            a = _value(rng, field)
            b = hi if step_s else a
        if not (lo <= a <= hi and lo <= b <= hi and a <= b):
            raise CronError(f"field {field + 1}: {part!r} outside {lo}-{hi}")
        out.update(range(a, b + 1, step))
    if field == 4 and 7 in out:
        out = (out - {7}) | {0}
    return frozenset(out), text == "*"


@dataclass(frozen=True)
class Cron:
    """A parsed schedule."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, expr: str) -> Cron:
        text = MACROS.get(expr.strip().lower(), expr.strip())
        fields = text.split()
        if len(fields) != 5:
            raise CronError(f"{expr!r}: expected 5 fields or a macro such as @daily")
        parsed = [_field(f, i) for i, f in enumerate(fields)]
        return cls(
            parsed[0][0],
            parsed[1][0],
            parsed[2][0],
            parsed[3][0],
            parsed[4][0],
            any_day=parsed[2][1],
            any_weekday=parsed[4][1],
        )

    def _day_matches(self, d: dt.datetime) -> bool:
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow

    def next_after(self, after: dt.datetime) -> dt.datetime:
        """The first matching minute strictly after `after` (UTC)."""
        t = after.astimezone(dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
        start = t
        while t - start < dt.timedelta(days=MAX_SEARCH_DAYS):
            if t.month not in self.months or not self._day_matches(t):
                t = (t + dt.timedelta(days=1)).replace(hour=0, minute=0)
                continue
            if t.hour not in self.hours:
                t = (t + dt.timedelta(hours=1)).replace(minute=0)
                continue
            if t.minute not in self.minutes:
                t += dt.timedelta(minutes=1)
                continue
            return t
        raise CronError("the schedule never fires")


def fired_since(expr: str, since_unix_s: float, now_unix_s: float) -> bool:
    """Whether the schedule fired in (since, now]."""
    nxt = Cron.parse(expr).next_after(dt.datetime.fromtimestamp(since_unix_s, dt.UTC))
    return nxt.timestamp() <= now_unix_s
