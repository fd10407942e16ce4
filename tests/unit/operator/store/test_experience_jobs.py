"""The experience store's per-job reads: a job's summary and the outcomes the canary judge
compares (exploration left out, model versions filtered).

Like test_experience.py, run again on PostgreSQL by test_store_postgres.py.
"""

from __future__ import annotations

import time

import pytest

from tests.unit.operator.store.experience_suite import (
    FakeClock,
    MakeStore,
    make_batch,
    make_store,
    rec,
    store_url,
)

__all__ = ["make_store", "store_url"]  # fixtures


def test_job_summary(make_store: MakeStore) -> None:
    clock = FakeClock(50.0)
    s = make_store(clock=clock)
    base = {"size_bucket": 20, "nbytes_min": 1 << 20, "nbytes_max": (2 << 20) - 1}
    s.insert_batch(
        make_batch(
            1,
            [
                rec(0, **base, count=100, mean_time_us=100.0, nccl_default_time_us=150.0),
                rec(
                    0,
                    **base,
                    algo="tree",
                    origin="explore",
                    count=50,
                    mean_time_us=200.0,
                    p99_time_us=250.0,
                    nccl_default_time_us=150.0,
                ),
            ],
            events=[
                {
                    "kind": "guardrail_revert",
                    "collective": "allreduce",
                    "size_bucket": 20,
                    "nbytes_min": 1 << 20,
                    "nbytes_max": (2 << 20) - 1,
                    "call_index": 40,
                    "regression": 0.3,
                    "message": "tree slower",
                },
            ],
        )
    )
    clock.t = 60.0
    s.insert_batch(
        make_batch(
            2,
            [rec(0, **base, count=50, mean_time_us=100.0, nccl_default_time_us=150.0)],
            events=[
                {
                    "kind": "exploration_done",
                    "collective": "allreduce",
                    "size_bucket": 20,
                    "nbytes_min": 1 << 20,
                    "nbytes_max": (2 << 20) - 1,
                    "call_index": 200,
                },
            ],
        )
    )
    sm = s.job_summary("job-uid-0")
    assert (sm.batches, sm.records, sm.calls) == (2, 3, 200)
    (bucket,) = sm.buckets
    assert bucket.calls == 200
    assert bucket.mean_time_us == pytest.approx((150 * 100 + 50 * 200) / 200)
    assert bucket.nccl_default_time_us == pytest.approx(150.0)
    assert bucket.speedup == pytest.approx(150.0 / 125.0)
    assert bucket.configurations_tried == 2
    assert bucket.explored_calls == 50
    assert sm.speedup == pytest.approx(150.0 / 125.0)
    assert sm.exploratory_calls == 50
    assert sm.guardrail_events == 1
    assert sm.buckets_converged == 1
    assert [e.kind.value for e in sm.recent_events] == ["exploration_done", "guardrail_revert"]
    assert sm.recent_events[1].regression == pytest.approx(0.3)
    assert sm.last_received_unix_s == 60.0
    empty = s.job_summary("nobody")
    assert (empty.batches, empty.calls, empty.speedup, empty.buckets) == (0, 0, None, ())


def test_job_outcomes_exclude_exploration_and_filter_versions(make_store: MakeStore) -> None:
    s = make_store()
    s.insert_batch(
        make_batch(
            1,
            [
                rec(0, count=10, mean_time_us=100.0, nccl_default_time_us=200.0),
                rec(1, count=10, origin="explore", mean_time_us=1000.0, p99_time_us=1000.0),
            ],
            job_uid="a",
            model_version="v1",
        )
    )
    s.insert_batch(
        make_batch(
            1,
            [rec(0, count=4, mean_time_us=100.0, nccl_default_time_us=90.0)],
            pod_uid="p2",
            job_uid="b",
            model_version="v2",
        )
    )
    outs = {o.job_uid: o for o in s.job_outcomes()}
    assert outs["a"].calls == 10
    assert outs["a"].speedup == pytest.approx(2.0)
    assert outs["b"].speedup == pytest.approx(0.9)
    assert [o.job_uid for o in s.job_outcomes(["v2"])] == ["b"]
    assert s.job_outcomes([]) == []
    assert s.job_outcomes(since_unix_s=time.time() + 3600) == []
    assert len(s.job_outcomes(since_unix_s=0.0)) == 2


# --- retention --------------------------------------------------------------------
