"""Rolling experience up (operator/store/rollup.py): the store shrinks, training reads the same.

Runs on SQLite here and on PostgreSQL through tests/integration/operator/test_store_postgres.py
(the `make_store` / `store_url` fixtures)."""

from __future__ import annotations

import math
import random

from dynamiccl.api.features import StateFeatures
from dynamiccl.operator.store.experience import ExperienceStore
from dynamiccl.operator.store.rollup import HOUR_S, rollup
from dynamiccl.policy.train.store_data import TrainingData, collect
from tests.unit.operator.store.experience_suite import (
    FakeClock,
    MakeStore,
    make_batch,
    make_store,
    rec,
    store_url,
)
from tests.unit.policy.train.test_offline import FEATURES

__all__ = ["make_store", "store_url"]

T0 = 1_699_999_200.0  # on the hour


def _fill(s: ExperienceStore, clock: FakeClock, rng: random.Random, hours: int = 3) -> None:
    """Two jobs of four pods, a batch per pod every 10 minutes (each of a new table version),
    three cells x two choices."""
    seq = 0
    for step in range(hours * 6):
        clock.t = T0 + step * 600
        for job in ("job-a", "job-b"):
            for pod in range(4):
                seq += 1
                recs = [
                    rec(
                        i,
                        count=rng.randint(1, 50),
                        mean_time_us=rng.uniform(50, 200),
                        nccl_default_time_us=rng.uniform(50, 200),
                        p50_time_us=40.0,
                        p99_time_us=250.0,
                    )
                    for i in (0, 1, 2, 8, 9, 10)  # channels 0 and 1 in buckets 20-22
                ]
                b = make_batch(seq, recs, pod_uid=f"{job}-{pod}", job_uid=job)
                s.insert_batch(b.model_copy(update={"table_version": step + 1}))  # an epoch each


def _training(url: str, after_id: int = 0) -> TrainingData:
    feats = StateFeatures.model_validate(FEATURES)
    return collect(url, after_id=after_id, overrides={"job-a": feats, "job-b": feats})


def _same(a: TrainingData, b: TrainingData) -> None:
    assert a.calls == b.calls
    assert a.adv.keys() == b.adv.keys()
    for k, v in a.adv.items():
        assert math.isclose(v, b.adv[k], rel_tol=1e-9, abs_tol=1e-9), k


def test_rolled_rows_train_the_same_and_keep_calls_and_time(
    make_store: MakeStore, store_url: str
) -> None:
    clock = FakeClock()
    s = make_store(clock=clock)
    _fill(s, clock, random.Random(1))
    before_rows = s.count_experience()
    calls, summary = s.stored_calls(), s.job_summary("job-a")
    trained = _training(store_url)
    cursor = s.max_experience_id()
    res = rollup(s.backend, before_unix_s=T0 + 3 * HOUR_S, max_id=cursor, bucket_s=HOUR_S)
    # 2 jobs x 6 configurations x 3 hours, from 2 x 4 pods x 6 x 18 rows of 18 table versions
    assert (res.rows_before, res.rows_after) == (before_rows, 2 * 6 * 3)
    assert s.count_experience() == 36
    assert s.stored_calls() == calls
    after = s.job_summary("job-a")
    assert after.calls == summary.calls
    _same(trained, _training(store_url))
    assert {r.table_version for r in s.experience_since(0)} == {6, 12, 18}  # each hour's newest
    # again: nothing left to fold, nothing changes
    assert (
        rollup(s.backend, before_unix_s=T0 + 3 * HOUR_S, max_id=cursor, bucket_s=HOUR_S).rows_after
        == 0
    )
    _same(trained, _training(store_url))


def test_only_old_rows_already_trained_on_are_rolled(make_store: MakeStore, store_url: str) -> None:
    clock = FakeClock()
    s = make_store(clock=clock)
    _fill(s, clock, random.Random(2))
    rows = s.experience_since(0, limit=10**6)
    cursor = rows[len(rows) // 2].id  # the last training read up to here
    cutoff = T0 + 2 * HOUR_S
    new_part = _training(store_url, after_id=cursor)
    res = rollup(s.backend, before_unix_s=cutoff, max_id=cursor, bucket_s=HOUR_S)
    assert 0 < res.rows_after < res.rows_before
    left = s.experience_since(0, limit=10**6)
    untouched = [r for r in rows if r.id > cursor or r.received_unix_s >= cutoff]
    assert [r for r in left if r.id > cursor or r.received_unix_s >= cutoff] == untouched
    _same(new_part, _training(store_url, after_id=cursor))  # the next retrain reads the same
    assert len(left) == len(rows) - res.rows_before + res.rows_after


def test_a_day_of_rows_becomes_one_row_per_job_and_configuration(
    make_store: MakeStore, store_url: str
) -> None:
    clock = FakeClock()
    s = make_store(clock=clock)
    _fill(s, clock, random.Random(3), hours=1)
    trained = _training(store_url)
    rollup(s.backend, before_unix_s=T0 + HOUR_S, max_id=s.max_experience_id())  # a day
    assert s.count_experience() == 2 * 6
    _same(trained, _training(store_url))
