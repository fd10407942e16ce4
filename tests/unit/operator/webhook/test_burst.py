"""Issue 19, item 9: the webhook answers within its timeout under 40 concurrent requests.

Every pod of the burst misses the cache (its job's ConfigMap is not there yet),
and each is of a job of its own (one job's pods share one lookup: the last test),
so each lookup blocks for the operator's cache-miss wait (run.MISS_WAIT_SECONDS)
in one of the server's 32 threads. Before the fix the last 8 requests queued
behind the first 32 and were answered after 2 x 2.0 s = 4 s, past the
apiserver's 3 s webhook timeout. Now every answer leaves within the answer
budget (2.5 s): the queued ones untuned, never late.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from dynamiccl.operator.controller.cache import ObjectCache
from dynamiccl.operator.run import MISS_WAIT_SECONDS
from dynamiccl.operator.webhook import server as webhook
from tests.unit.operator.webhook.test_server import CM, _pod, _post_over_http, _review

WEBHOOK_TIMEOUT_S = 3.0  # the chart's webhook.timeoutSeconds ceiling (test_chart.py)


@dataclass
class _TimedAdmission(webhook.Admission):
    """The product's Admission, recording how long each review took inside the server."""

    took: list[float] = field(default_factory=list)

    async def review(self, body: Mapping[str, Any]) -> dict[str, Any]:
        t0 = time.monotonic()
        out = await super().review(body)
        self.took.append(time.monotonic() - t0)
        return out


@pytest.mark.parametrize("burst", [40, 72])
def test_concurrent_cache_misses_are_all_answered_within_the_timeout(burst: int) -> None:
    """40: the issue's burst; 72: two rounds of the server's 32 threads and 8 more, which the
    budget must also answer in time (without it the last 8 are answered after 3 lookups).

    Timed inside the server, from the review's start to its answer: the 40 client threads
    of this test share the server's process (and its GIL) on a CI machine that runs other
    tests beside it, which the apiserver's own connections never do."""
    assert MISS_WAIT_SECONDS < webhook.ANSWER_BUDGET_S < WEBHOOK_TIMEOUT_S

    def slow_miss(_ns: str, _job: str, _pod: Any) -> None:
        time.sleep(MISS_WAIT_SECONDS)  # the ConfigMap never appears within the wait

    adm = _TimedAdmission(config_maps=ObjectCache(), image="img", miss_lookup=slow_miss)
    server = webhook.ServerThread(webhook.app(adm), "127.0.0.1", 0, None)
    server.start()
    try:

        def one(i: int) -> bool:
            out = _post_over_http(server.port, _review(_pod(f"job-{i}")))
            return out["response"]["allowed"] is True

        with concurrent.futures.ThreadPoolExecutor(burst) as pool:
            allowed = list(pool.map(one, range(burst)))
    finally:
        server.stop()
    assert allowed == [True] * burst
    took = sorted(adm.took)
    assert len(took) == burst
    assert took[-1] < WEBHOOK_TIMEOUT_S, f"slowest answers: {took[-5:]}"


def test_one_jobs_pods_missing_the_cache_together_share_one_lookup() -> None:
    """Issue 33: a job's pods created in one burst before its ConfigMap reaches the cache
    (the operator restarted, or its watch lags) make one lookup (one apiserver GET, one wait)
    between them, not one each, and every pod is tuned."""
    calls: list[str] = []

    def lookup(_ns: str, job: str, _pod: Any) -> Mapping[str, Any]:
        calls.append(job)
        time.sleep(1.0)  # the GET, or the wait for the ConfigMap, in flight
        return CM

    adm = _TimedAdmission(config_maps=ObjectCache(), image="img", miss_lookup=lookup)
    server = webhook.ServerThread(webhook.app(adm), "127.0.0.1", 0, None)
    server.start()
    try:

        def one(_: int) -> bool:
            out = _post_over_http(server.port, _review(_pod("llm")))
            return "patch" in out["response"]

        with concurrent.futures.ThreadPoolExecutor(48) as pool:
            tuned = list(pool.map(one, range(48)))
    finally:
        server.stop()
    assert tuned == [True] * 48
    # one per second of arrivals at most (a request that arrives after a lookup ended makes
    # the next one): the 48 requests arrive within a second or two, even on a loaded machine
    assert 1 <= len(calls) <= 3, calls
