"""The experience store's contract, run here on SQLite.

tests/integration/operator/test_store_postgres.py runs every `test_*` of this
module (and of test_experience_jobs.py) again, parametrized over SQLite and a real
PostgreSQL server: the tests only use the `make_store` fixture, never a backend detail.
Records, batches and fixtures: experience_suite.py.
"""

from __future__ import annotations

import threading

import pytest

import dynamiccl.operator.store.experience as store_mod
from dynamiccl.api.rewards import RewardBatch
from dynamiccl.operator.store.experience import (
    ExperienceStore,
    IdempotencyConflict,
    InsertOutcome,
)
from dynamiccl.operator.store.migrations import LATEST_VERSION
from tests.unit.operator.store.experience_suite import (
    FakeClock,
    MakeStore,
    make_batch,
    make_store,
    rec,
    store_url,
)

__all__ = ["make_store", "store_url"]  # fixtures (test_store_postgres.py takes make_store)


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


def test_replicas_committing_overlapping_groups_store_each_batch_once(
    make_store: MakeStore,
) -> None:
    """Two ingest replicas (two connections) group-commit the same batches in opposite
    orders, as after sidecars resent to the other replica: every batch is stored once, and
    no transaction fails (on PostgreSQL, keys taken in opposite orders deadlocked one)."""
    stores = [make_store(), make_store()]
    batches = [make_batch(i, [rec(i % 5)]) for i in range(256)]
    groups = [batches[i : i + 8] for i in range(0, 256, 8)]
    plans = [groups, [list(reversed(g)) for g in reversed(groups)]]
    new: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(st: ExperienceStore, plan: list[list[RewardBatch]]) -> None:
        for group in plan:
            try:
                outs = st.insert_batches(group)
            except Exception as exc:
                with lock:
                    errors.append(exc)
                continue
            with lock:
                new.extend(1 for o in outs if isinstance(o, InsertOutcome) and not o.duplicate)

    threads = [threading.Thread(target=work, args=a) for a in zip(stores, plans, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(new) == len(batches)
    assert stores[0].batch_count() == len(batches)
    assert stores[1].stored_calls() == sum(b.calls for b in batches)


def test_group_outcomes_follow_the_callers_order(make_store: MakeStore) -> None:
    s = make_store()
    outs = s.insert_batches([make_batch(9), make_batch(1, [rec(0)]), make_batch(5)])
    assert outs == [InsertOutcome(3, False), InsertOutcome(1, False), InsertOutcome(3, False)]


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
    assert s.jobs_updated_since(1004.0) == [("team-a", "PyTorchJob", "llm", "job-uid-0")]
    assert s.jobs_updated_since(1004.5) == []
    assert len(s.experience_since(0, limit=2)) == 2


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
