"""Per-pod and per-job rate limits of the reward ingest (token buckets, in records).

A batch costs its records plus its events (at least 1). Each authenticated pod
(its uid) and each job (its uid) has a bucket refilled at `rate` records per
second up to `burst`; a batch that finds either bucket short is answered 429
with `Retry-After` (the seconds until it would fit) and stores nothing. Checked
after authorisation, so the keys are the token's own pod and the verified job:
nobody can drain another pod's or job's bucket. Buckets live in memory (one
ingest replica per store), at most `max_keys` of each kind (least recently used
dropped first: a dropped key starts full again).

`total` (optional) is one more bucket for everything this replica stores: the
store's budget (records/s a retrain can keep up with, docs/admin-guide.md 'Large
clusters'). Past it every sidecar is told 429 with Retry-After, stretches its cut
interval (sidecar/pace.py) and folds more calls into each record: the cluster
settles at the budget, and nothing measured is lost.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

DEFAULT_POD_RATE: Final = 500.0  # records/s: a sidecar sends one batch every few seconds
DEFAULT_POD_BURST: Final = 4096.0  # eight full batches (512 records) at once
DEFAULT_JOB_RATE: Final = 20_000.0
DEFAULT_JOB_BURST: Final = 100_000.0


@dataclass(frozen=True)
class Limit:
    """Refill rate (records/s) and capacity (records) of one kind of bucket."""

    rate: float
    burst: float


DEFAULT_POD: Final = Limit(DEFAULT_POD_RATE, DEFAULT_POD_BURST)
DEFAULT_JOB: Final = Limit(DEFAULT_JOB_RATE, DEFAULT_JOB_BURST)
UNLIMITED: Final = Limit(math.inf, math.inf)


class _Buckets:
    def __init__(self, limit: Limit, max_keys: int) -> None:
        self.limit = limit
        self._max = max_keys
        self._level: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, t)

    def wait(self, key: str, cost: float, now: float) -> float:
        """Seconds until `cost` fits (0: it fits now; not taken)."""
        tokens, t = self._level.get(key, (self.limit.burst, now))
        tokens = min(self.limit.burst, tokens + (now - t) * self.limit.rate)
        self._level[key] = (tokens, now)
        self._level.move_to_end(key)
        while len(self._level) > self._max:
            self._level.popitem(last=False)
        if tokens >= cost:
            return 0.0
        if cost > self.limit.burst:  # can never fit: one full refill
            return self.limit.burst / self.limit.rate
        return (cost - tokens) / self.limit.rate

    def take(self, key: str, cost: float) -> None:
        tokens, t = self._level[key]
        self._level[key] = (tokens - cost, t)


class RateLimiter:
    """Both kinds of buckets; `admit` takes from both or from neither."""

    def __init__(
        self,
        pod: Limit | None = None,
        job: Limit | None = None,
        *,
        max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
        total: Limit | None = None,
    ) -> None:
        self.pod = _Buckets(pod or DEFAULT_POD, max_keys)
        self.job = _Buckets(job or DEFAULT_JOB, max_keys)
        self.total = _Buckets(total, 1) if total is not None else None
        self._clock = clock

    def limit(self, what: str) -> Limit:
        """The limit named in an `admit` answer."""
        buckets = {"pod": self.pod, "job": self.job}.get(what) or self.total
        assert buckets is not None
        return buckets.limit

    def admit(self, pod_uid: str, job_uid: str, cost: int) -> tuple[str, int] | None:
        """None when the batch may be stored (its cost taken); else (which limit, the
        whole seconds to wait) for the 429 answer."""
        now = self._clock()
        cost_f = float(max(1, cost))
        checks = [("pod", self.pod, pod_uid), ("job", self.job, job_uid)]
        if self.total is not None:
            checks.append(("store", self.total, ""))
        for what, buckets, key in checks:
            wait = buckets.wait(key, cost_f, now)
            if wait > 0:
                return what, max(1, math.ceil(wait))
        for _, buckets, key in checks:
            buckets.take(key, cost_f)
        return None
