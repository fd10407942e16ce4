"""Pure summary of grouped experience rows (the SQL side is tested in test_store.py)."""

from __future__ import annotations

import pytest

from dynamiccl.operator.store.summary import RECENT_EVENTS, JobOutcome, summarise


def group(
    bucket: int, algo: str, origin: str, *, calls: int, t: float, d: float
) -> tuple[object, ...]:
    # collective, size_bucket, nranks, nnodes, algo, proto, nchannels, chunk, origin,
    # min nbytes, max nbytes, calls, sum(count*mean), sum(count*default)
    return (
        "allreduce",
        bucket,
        8,
        1,
        algo,
        "ll",
        0,
        0,
        origin,
        1 << bucket,
        (2 << bucket) - 1,
        calls,
        calls * t,
        calls * d,
    )


def event(kind: str, bucket: int) -> tuple[object, ...]:
    return (kind, "allreduce", bucket, 1 << bucket, (2 << bucket) - 1, 7, 0.1, "m")


def test_buckets_are_call_weighted_and_sorted() -> None:
    s = summarise(
        "j",
        [
            group(12, "ring", "table", calls=30, t=10.0, d=20.0),
            group(10, "tree", "table", calls=10, t=5.0, d=5.0),
            group(12, "tree", "explore", calls=10, t=30.0, d=20.0),
        ],
        (3, 3, 9.0),
        [event("exploration_done", 12), event("guardrail_revert", 10)],
    )
    assert [b.size_bucket for b in s.buckets] == [10, 12]
    b12 = s.buckets[1]
    assert b12.calls == 40
    assert b12.mean_time_us == pytest.approx((30 * 10 + 10 * 30) / 40)
    assert b12.speedup == pytest.approx(20.0 / 15.0)
    assert (b12.configurations_tried, b12.explored_calls) == (2, 10)
    assert s.speedup == pytest.approx((800 + 50) / (600 + 50))
    assert (s.buckets_converged, s.guardrail_events, s.change_events) == (1, 1, 0)
    assert s.last_received_unix_s == 9.0


def test_recent_events_are_capped() -> None:
    evs = [event("change_detected", 3)] * (RECENT_EVENTS + 5)
    s = summarise("j", [], (1, 0, 1.0), evs)
    assert len(s.recent_events) == RECENT_EVENTS
    assert s.change_events == RECENT_EVENTS + 5
    assert s.speedup is None


def test_outcome_speedup() -> None:
    assert JobOutcome("j", "v", 10, 100.0, 150.0).speedup == pytest.approx(1.5)
    assert JobOutcome("j", "v", 0, 0.0, 0.0).speedup == 0.0
