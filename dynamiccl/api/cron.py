"""Cron schedules (5 fields or @macros), evaluated in UTC: parsing and validation.

Shared by the NCCLTuningPolicy model (`Retraining.schedule` is validated here, so
the CLI, the operator's policy matching and the learning loop agree on what a
valid schedule is) and the learning loop (`fired_since`: did the schedule fire
since the last retrain). Parsing comes from `cronsim` (small, no dependencies, maintained
by healthchecks.io): classic 5-field syntax with names, steps and ranges,
weekday 0 and 7 both Sunday, and day-of-month OR day-of-week when both are
restricted. It rejects a day that no month has (`0 0 31 2 *`) when parsing.
We only expand the @macros it does not read.
"""

from __future__ import annotations

import datetime as dt
from typing import Final

from cronsim import CronSim, CronSimError

MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class CronError(ValueError):
    """A schedule that cannot be parsed, or never fires."""


def schedule(expr: str, after: dt.datetime) -> CronSim:
    """The schedule's iterator of firing times after `after` (CronError if unparsable)."""
    fields = MACROS.get(expr.strip().lower(), expr.strip())
    try:
        return CronSim(fields, after.astimezone(dt.UTC))
    except CronSimError as exc:
        raise CronError(f"invalid cron schedule {expr!r}: {exc}") from exc


def next_after(expr: str, after: dt.datetime) -> dt.datetime:
    """The first minute the schedule fires strictly after `after` (UTC)."""
    try:
        return next(schedule(expr, after))
    except StopIteration as exc:  # pragma: no cover - cronsim rejects such schedules at parse
        raise CronError(f"cron schedule {expr!r} never fires") from exc


def validate(expr: str) -> None:
    """Raise CronError unless `expr` parses and fires at least once."""
    next_after(expr, dt.datetime(2000, 1, 1, tzinfo=dt.UTC))


def fired_since(expr: str, since_unix_s: float, now_unix_s: float) -> bool:
    """Whether the schedule fired in (since, now]."""
    nxt = next_after(expr, dt.datetime.fromtimestamp(since_unix_s, dt.UTC))
    return nxt.timestamp() <= now_unix_s
