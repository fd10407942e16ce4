"""Migration 5 (job features) on a real PostgreSQL store that already holds experience.

A throw-away PostgreSQL server (dynamiccl/testing/postgres.py: initdb + postgres in a temp
dir, needs the Debian `postgresql-15` package or PG_BIN) gets a store at schema
4 with reward rows and an env-knob assignment, as an operator of the previous
release left it. The current operator opens it: migration 5 is applied once,
every stored row survives unchanged, and the job features written afterwards are
what a retrain reads back (the training reader on the same server), with the rows
it cannot use (no features, an unknown features schema version, features that
fail validation, a record that is no valid reward) skipped and counted, never
fatal.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dynamiccl.operator.learning.features_sync import record_from_runs
from dynamiccl.operator.store.experience import open_store
from dynamiccl.operator.store.features import stored_features
from dynamiccl.operator.store.migrations import LATEST_VERSION
from dynamiccl.policy.train.store_data import collect
from dynamiccl.testing import postgres as pg_server
from tests.unit.policy.train.test_offline import FEATURES, _record
from tests.unit.policy.train.test_store_data import _batch, _run

JOBS = ("good", "none", "future", "broken")
_COLUMNS = (
    "idempotency_key, namespace, job_kind, job_name, job_uid, pod_uid, model_version, "
    "table_version, received_unix_s, collective, size_bucket, nbytes_min, nbytes_max, nranks, "
    "nnodes, algo, proto, nchannels, chunk_bytes, origin, count, mean_time_us, p50_time_us, "
    "p99_time_us, busbw_gbps, nccl_default_time_us"
)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Any]:
    if not pg_server.available():
        pytest.fail("PostgreSQL binaries missing: apt-get install postgresql-15 (or set PG_BIN)")
    with pg_server.PgServer() as pg:
        yield pg


def _schema4_store_with_rows(url: str) -> list[Any]:
    """The previous release's store: schema 4, two reward records per job, a knob arm, and a
    row no reward record validates (a negative mean, written by hand)."""
    old = open_store(url, migrate=False)
    assert old.migrate(target=4) == [1, 2, 3, 4]
    good = [_record("tree", "simple", 70.0, 100.0), _record("ring", "ll", 200.0, 100.0)]
    for i, uid in enumerate(JOBS):
        old.insert_batch(_batch(i, uid, good))
    with old.backend.transaction() as cur:
        cur.execute(
            "INSERT INTO job_knobs (job_uid, policy, cohort, cohort_description, arm, "
            "recorded_unix_s) VALUES (?, ?, ?, ?, ?, ?)",
            ("good", "default", "c-1", "h100 x2", "nccl", 5.0),
        )
        cur.execute(
            f"INSERT INTO experience ({_COLUMNS}) SELECT "
            + _COLUMNS.replace("mean_time_us", "-5.0", 1)
            + " FROM experience WHERE job_uid = 'good' ORDER BY id LIMIT 1"
        )
    assert old.schema_version() == 4
    rows = _all_rows(old)
    old.close()
    return rows


def _all_rows(store: Any) -> list[Any]:
    with store.backend.transaction(write=False) as cur:
        cur.execute("SELECT * FROM experience ORDER BY id")
        return list(cur.fetchall())


def test_migration_5_keeps_every_row_and_the_retrain_reads_the_features_it_adds(
    postgres: Any,
) -> None:
    postgres.reset()
    url = str(postgres.url)
    before = _schema4_store_with_rows(url)
    assert len(before) == 9

    store = open_store(url, migrate=False)
    assert store.migrate() == list(range(5, LATEST_VERSION + 1))  # 5, and every later one
    assert store.schema_version() == LATEST_VERSION >= 5
    assert store.migrate() == []  # idempotent: a second operator replica applies nothing
    assert _all_rows(store) == before  # every row survived unchanged
    with store.backend.transaction(write=False) as cur:
        cur.execute("SELECT job_uid, arm FROM job_knobs")
        assert cur.fetchall() == [("good", "nccl")]

    # the new table is usable: features recorded after the migration, read back
    runs = [
        _run("good", FEATURES),
        _run("future", {**FEATURES, "version": 99}),  # a schema this code does not know
        _run("broken", {**FEATURES, "world_size": 3}),  # fails validation
    ]
    assert record_from_runs(store, runs, now=10.0) == 3
    assert record_from_runs(store, runs, now=11.0) == 0  # the first write wins
    version, _cls, text = stored_features(store.backend, "good") or (0, "", "")
    assert version == 1
    assert json.loads(text)["world_size"] == FEATURES["world_size"]
    store.close()

    # the retrain's reader on the migrated PostgreSQL store
    stats = collect(url).stats()
    assert stats["offline/records"] == 9
    assert stats["offline/used"] == 2
    assert stats["offline/skipped_no_features"] == 2
    assert stats["offline/skipped_unknown_schema_version"] == 2
    assert stats["offline/skipped_invalid_features"] == 2
    assert stats["offline/skipped_invalid_row"] == 1
