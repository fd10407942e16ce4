"""Cron schedules for the policy's retraining schedule: when one fired (UTC).

Parsing and validation live in dynamiccl/api/cron.py (cronsim), shared with the
NCCLTuningPolicy model's validator, so a schedule the policy accepts is one the
loop can evaluate.
"""

from __future__ import annotations

import datetime as dt

from dynamiccl.api.cron import MACROS, CronError, next_after, validate

__all__ = ["MACROS", "CronError", "fired_since", "next_after", "validate"]


def fired_since(expr: str, since_unix_s: float, now_unix_s: float) -> bool:
    """Whether the schedule fired in (since, now]."""
    nxt = next_after(expr, dt.datetime.fromtimestamp(since_unix_s, dt.UTC))
    return nxt.timestamp() <= now_unix_s
