"""Issue 19, item 7: per-pod and per-job rate limits with a clear 429 (and nothing stored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynamiccl.operator.ingest.ratelimit import Limit, RateLimiter
from tests.unit.operator.ingest.ingest_server import FakeKube, Server, payload, record


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def test_buckets_refill_and_take_from_both_or_neither() -> None:
    clock = Clock()
    rl = RateLimiter(Limit(10, 100), Limit(1000, 150), clock=clock)
    assert rl.admit("p1", "j", 100) is None
    assert rl.admit("p1", "j", 1) == ("pod", 1)  # empty: 0.1 s to the next record
    assert rl.admit("p2", "j", 60) == ("job", 1)  # the job has 50 left, the pod is untouched
    assert rl.admit("p2", "j", 50) is None
    clock.t += 2.0  # +20 for the pod, the job refills to its burst
    assert rl.admit("p1", "j", 20) is None
    assert rl.admit("p1", "j", 1000) == ("pod", 10)  # never fits: a whole refill


@pytest.fixture
def server(tmp_path: Path, running_ingest: Any) -> Any:
    s = Server.__new__(Server)
    s.kube = FakeKube()
    s.run = running_ingest(tmp_path, s.kube, rate_job=Limit(10, 5000))
    s.svc, s.port, s.ctx, s.crt = s.run.svc, s.run.port, s.run.ctx, s.run.crt
    # the buckets' clock stands still while the test posts (a loaded machine takes seconds for
    # ten HTTPS posts, and a real clock would refill the bucket between them); the tests that
    # need time to pass use `RateLimiter` with their own clock
    s.svc.handler.limiter._clock = Clock()
    yield s
    s.stop()


def full_batch(pod: int, seq: int) -> dict[str, Any]:
    b = payload(0, pod=f"llm-worker-{pod}", uid=f"pod-{pod}", seq=seq)
    b["records"] = [record(i % 32, nchannels=i // 32) for i in range(512)]
    return b


def test_one_pod_flooding_gets_429_with_retry_after_and_stores_nothing_more(
    server: Any,
) -> None:
    answers = [server.post(full_batch(0, seq), "tok-w0") for seq in range(10)]
    codes = [a[0] for a in answers]
    assert codes[:8] == [200] * 8  # the pod's burst: 4096 records
    assert codes[8:] == [429, 429]
    status, body = answers[8]
    assert body["error"] == "rate_limited"
    assert "this pod sent more than 500 records/s" in body["detail"]
    assert server.stored() == 8 * 512
    # another pod of the same job still reports, until the job's own bucket runs dry
    assert server.post(full_batch(1, 1), "tok-w1")[0] == 200
    status, body = server.post(full_batch(1, 2), "tok-w1")
    assert status == 429
    assert "this job sent more than 10 records/s" in body["detail"]
    assert server.stored() == 9 * 512


def test_the_store_budget_limits_all_pods_together() -> None:
    """Two pods of two jobs, each well within its own limits, together past this replica's
    store budget: the one that would pass it is told to wait, and nothing is taken from it."""
    clock = Clock()
    rl = RateLimiter(Limit(1000, 5000), Limit(1000, 5000), clock=clock, total=Limit(100, 600))
    assert rl.admit("p1", "j1", 400) is None
    assert rl.admit("p2", "j2", 400) == ("store", 2)  # 200 left: 2 s at 100 records/s
    assert rl.limit("store") == Limit(100, 600)
    clock.t += 2.0
    assert rl.admit("p2", "j2", 400) is None  # its own buckets were not charged by the 429
    assert RateLimiter(clock=clock).admit("p3", "j3", 512) is None  # no budget: no limit


def test_the_budget_flag_reaches_the_limiter() -> None:
    from dynamiccl.operator.ingest.cli import parse  # noqa: PLC0415
    from dynamiccl.operator.ingest.main import limiter  # noqa: PLC0415

    s = parse(["--store", "x.db", "--insecure-http", "--rate-store", "5000"])
    rl = limiter(s)
    assert rl is not None
    assert rl.total is not None
    assert rl.total.limit == Limit(5000, 50_000)
    none = limiter(parse(["--store", "x.db", "--insecure-http"]))
    assert none is not None
    assert none.total is None
