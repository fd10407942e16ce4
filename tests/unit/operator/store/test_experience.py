"""The experience store's contract, run here on SQLite.

tests/integration/operator/test_store_postgres.py runs every `test_*` of this
module again, parametrized over SQLite and a real PostgreSQL server: the
tests only use the `make_store` fixture, never a backend detail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dynamiccl.operator.store.experience as store_mod
from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.store.experience import (
    ExperienceStore,
    IdempotencyConflict,
    InsertOutcome,
    open_store,
)
from dynamiccl.operator.store.migrations import LATEST_VERSION

MakeStore = Callable[..., ExperienceStore]


class FakeClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def rec(i: int = 0, **over: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "collective": "allreduce",
        "size_bucket": 20 + (i % 8),
        "nbytes_min": 1 << (20 + (i % 8)),
        "nbytes_max": (2 << (20 + (i % 8))) - 1,
        "nranks": 8,
        "nnodes": 1,
        "algo": "ring",
        "proto": "simple",
        "nchannels": i // 8,
        "chunk_bytes": 0,
        "origin": "table",
        "count": 10 + i,
        "mean_time_us": 100.0 + i,
        "p50_time_us": 99.0 + i,
        "p99_time_us": 150.0 + i,
        "busbw_GBps": 100.0,
        "nccl_default_time_us": 120.0 + i,
    }
    r.update(over)
    return r


def make_batch(
    seq: int,
    records: list[dict[str, Any]] | None = None,
    *,
    pod_uid: str = "pod-uid-0",
    job_uid: str = "job-uid-0",
    model_version: str = "v1",
    events: list[dict[str, Any]] | None = None,
) -> RewardBatch:
    return RewardBatch.model_validate(
        {
            "idempotency_key": f"{pod_uid}/{seq}",
            "job": {"namespace": "team-a", "kind": "PyTorchJob", "name": "llm", "uid": job_uid},
            "pod": {"name": f"llm-{pod_uid}", "uid": pod_uid},
            "model_version": model_version,
            "table_version": 1,
            "records": [rec(i) for i in range(3)] if records is None else records,
            "events": events or [],
        }
    )


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'experience.db'}"


@pytest.fixture
def make_store(store_url: str) -> Iterator[MakeStore]:
    opened: list[ExperienceStore] = []

    def make(**kw: Any) -> ExperienceStore:
        s = open_store(store_url, **kw)
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


# --- schema -------------------------------------------------------------------
def test_fresh_store_is_at_latest_schema_and_migration_is_idempotent(
    make_store: MakeStore,
) -> None:
    s = make_store()
    assert s.schema_version() == LATEST_VERSION
    assert s.migrate() == []
    again = make_store()  # a second process opening the same store
    assert again.schema_version() == LATEST_VERSION


def test_upgrade_from_v1_keeps_data(make_store: MakeStore) -> None:
    old = make_store(migrate=False)
    assert old.migrate(target=1) == [1]
    assert old.schema_version() == 1
    b = make_batch(1)
    assert old.insert_batch(b) == InsertOutcome(accepted=3, duplicate=False)
    old.close()
    new = make_store()  # migrates 2..latest
    assert new.schema_version() == LATEST_VERSION
    assert new.insert_batch(b).duplicate  # the v1 idempotency key still holds
    rows = new.experience_since(0)
    assert [r.record for r in rows] == list(b.records)
    summary = new.job_summary("job-uid-0")
    assert summary.records == 3
    assert summary.guardrail_events == 0  # events table exists now


# --- idempotent ingest -----------------------------------------------------------
def test_insert_then_retry_is_duplicate_and_writes_nothing(make_store: MakeStore) -> None:
    s = make_store()
    b = make_batch(1)
    assert s.insert_batch(b) == InsertOutcome(accepted=3, duplicate=False)
    calls = s.stored_calls()
    assert calls == b.calls
    retry = RewardBatch.model_validate_json(b.model_dump_json())
    assert s.insert_batch(retry) == InsertOutcome(accepted=0, duplicate=True)
    assert s.stored_calls() == calls
    assert s.count_experience() == 3
    assert s.batch_count() == 1


def test_same_key_other_payload_conflicts_and_writes_nothing(make_store: MakeStore) -> None:
    s = make_store()
    s.insert_batch(make_batch(1))
    other = make_batch(1, [rec(0, count=999)])
    with pytest.raises(IdempotencyConflict):
        s.insert_batch(other)
    assert s.stored_calls() == make_batch(1).calls
    assert s.count_experience() == 3


def test_group_insert_reports_each_outcome(make_store: MakeStore) -> None:
    s = make_store()
    s.insert_batch(make_batch(1))
    outs = s.insert_batches(
        [
            make_batch(2),
            make_batch(1),  # duplicate of a stored batch
            make_batch(1, [rec(5)]),  # conflict
            make_batch(2),  # duplicate within the group
            make_batch(3, [rec(1)]),
        ]
    )
    assert outs[0] == InsertOutcome(3, False)
    assert outs[1] == InsertOutcome(0, True)
    assert isinstance(outs[2], IdempotencyConflict)
    assert outs[3] == InsertOutcome(0, True)
    assert outs[4] == InsertOutcome(1, False)
    assert s.count_experience() == 3 + 3 + 1
    assert s.batch_count() == 3


def test_a_failing_group_writes_nothing_at_all(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_store()
    real = store_mod._experience_rows

    def broken(b: RewardBatch, now: float) -> list[tuple[object, ...]]:
        rows = real(b, now)
        if b.idempotency_key.endswith("/2"):
            rows[-1] = (*rows[-1][:-1], None)  # NOT NULL violated on the last record
        return rows

    monkeypatch.setattr(store_mod, "_experience_rows", broken)
    with pytest.raises(Exception, match=r"(?i)null"):
        s.insert_batches([make_batch(1), make_batch(2)])
    assert s.count_experience() == 0
    assert s.batch_count() == 0
    monkeypatch.setattr(store_mod, "_experience_rows", real)
    assert s.insert_batches([make_batch(1), make_batch(2)]) == [
        InsertOutcome(3, False),
        InsertOutcome(3, False),
    ]


def test_concurrent_writers_store_each_batch_once(make_store: MakeStore) -> None:
    stores = [make_store(), make_store()]  # two connections, as two operator replicas
    batches = [make_batch(i, [rec(i % 5)]) for i in range(40)]
    results: list[InsertOutcome] = []
    lock = threading.Lock()

    def work(st: ExperienceStore) -> None:
        for b in batches:
            out = st.insert_batch(b)
            with lock:
                results.append(out)

    threads = [threading.Thread(target=work, args=(st,)) for st in stores for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for r in results if not r.duplicate) == len(batches)
    assert sum(1 for r in results if r.duplicate) == 3 * len(batches)
    assert stores[0].stored_calls() == sum(b.calls for b in batches)


# --- queries ---------------------------------------------------------------------
def test_experience_round_trips_with_provenance(make_store: MakeStore) -> None:
    clock = FakeClock()
    s = make_store(clock=clock)
    b = make_batch(
        1, [rec(0, collective="allgather", algo="tree", proto="ll128", chunk_bytes=1 << 17)]
    )
    s.insert_batch(b)
    (row,) = s.experience_since(0)
    assert row.record == b.records[0]
    assert (row.job_uid, row.job_kind, row.job_name, row.namespace) == (
        "job-uid-0",
        "PyTorchJob",
        "llm",
        "team-a",
    )
    assert row.pod_uid == "pod-uid-0"
    assert row.model_version == "v1"
    assert row.received_unix_s == clock.t
    assert s.experience_for_job("job-uid-0") == [row]
    assert s.experience_for_job("other") == []


def test_experience_since_cursor_time_and_paging(make_store: MakeStore) -> None:
    clock = FakeClock(1000.0)
    s = make_store(clock=clock)
    for seq in range(5):
        clock.t = 1000.0 + seq
        s.insert_batch(make_batch(seq))
    rows = s.experience_since(0)
    ids = [r.id for r in rows]
    assert len(ids) == 15
    assert ids == sorted(ids)
    assert len(set(ids)) == 15
    cursor = ids[5]
    assert [r.id for r in s.experience_since(cursor)] == ids[6:]
    assert s.count_experience(cursor) == 9
    assert s.max_experience_id() == ids[-1]
    assert {r.received_unix_s for r in s.experience_since(0, since_unix_s=1003.0)} == {
        1003.0,
        1004.0,
    }
    assert [r.id for r in s.iter_experience(0, page=4)] == ids
    assert s.jobs_updated_since(1004.0) == [("team-a", "PyTorchJob", "llm", "job-uid-0")]
    assert s.jobs_updated_since(1004.5) == []
    assert len(s.experience_since(0, limit=2)) == 2


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
def test_retention_by_age_and_by_rows(make_store: MakeStore) -> None:
    clock = FakeClock(0.0)
    s = make_store(clock=clock)

    def dated(seq: int) -> RewardBatch:
        event = {
            "kind": "change_detected",
            "collective": "allreduce",
            "size_bucket": 1,
            "nbytes_min": 2,
            "nbytes_max": 3,
            "call_index": seq,
        }
        return make_batch(seq, events=[event])

    for seq in range(4):
        clock.t = seq * 86_400.0
        s.insert_batch(dated(seq))
    clock.t = 3 * 86_400.0 - 1
    res = s.apply_retention(max_age_s=2 * 86_400.0)  # drops day 0 (older than 2 days)
    assert (res.experience, res.events, res.batches) == (3, 1, 1)
    assert s.count_experience() == 9
    res = s.apply_retention(max_rows=4)
    assert res.experience == 5
    remaining = s.experience_since(0)
    assert len(remaining) == 4
    assert all(r.received_unix_s == 3 * 86_400.0 for r in remaining[1:])
    # max_rows never forgets idempotency keys: a late retry stays a duplicate
    assert s.insert_batch(dated(1)).duplicate
    assert s.apply_retention(max_rows=0).experience == 4
    assert s.count_experience() == 0
    with pytest.raises(ValueError, match="max_rows"):
        s.apply_retention(max_rows=-1)
