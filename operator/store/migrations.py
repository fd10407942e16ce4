"""Versioned schema of the experience store (SQLite and PostgreSQL).

`schema_version` holds one row per applied migration. `apply_migrations`
applies the missing ones in order, each in its own transaction together with
its `schema_version` row, so a crash between two migrations leaves a valid
older schema and a rerun continues where it stopped (idempotent). On
PostgreSQL concurrent migrators (two operator replicas) serialise on an
advisory lock; on SQLite on `BEGIN IMMEDIATE`.

Migrations are append-only: never edit a released one, add the next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Protocol


class Dialect(StrEnum):
    """SQL dialects the store speaks."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"


_TYPES: Final = {
    Dialect.SQLITE: {
        "id": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "real": "REAL",
        "bigint": "INTEGER",
    },
    Dialect.POSTGRES: {
        "id": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "real": "DOUBLE PRECISION",
        "bigint": "BIGINT",
    },
}

# Arbitrary, fixed key of the PostgreSQL advisory lock migrators take.
PG_MIGRATION_LOCK_KEY: Final = 0x44594E43434C  # "DYNCCL"


class Cursor(Protocol):
    """The slice of a DB-API cursor migrations need (placeholders are `?`)."""

    def execute(self, sql: str, params: Sequence[object] = ()) -> object: ...

    def fetchone(self) -> tuple[Any, ...] | None: ...

    def fetchall(self) -> list[tuple[Any, ...]]: ...


@dataclass(frozen=True)
class Migration:
    """One schema step: DDL statements with `{id}`, `{real}`, `{bigint}` type slots."""

    version: int
    description: str
    statements: tuple[str, ...]

    def render(self, dialect: Dialect) -> list[str]:
        """The statements in the dialect's types."""
        return [s.format(**_TYPES[dialect]) for s in self.statements]


MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        1,
        "batches (idempotency keys) and experience rows",
        (
            """CREATE TABLE batches (
                idempotency_key TEXT PRIMARY KEY,
                payload_sha256 TEXT NOT NULL,
                namespace TEXT NOT NULL,
                job_kind TEXT NOT NULL,
                job_name TEXT NOT NULL,
                job_uid TEXT NOT NULL,
                pod_name TEXT NOT NULL,
                pod_uid TEXT NOT NULL,
                model_version TEXT NOT NULL,
                table_version {bigint} NOT NULL,
                n_records INTEGER NOT NULL,
                received_unix_s {real} NOT NULL)""",
            "CREATE INDEX batches_job_uid ON batches (job_uid)",
            "CREATE INDEX batches_received ON batches (received_unix_s)",
            """CREATE TABLE experience (
                id {id},
                idempotency_key TEXT NOT NULL,
                namespace TEXT NOT NULL,
                job_kind TEXT NOT NULL,
                job_name TEXT NOT NULL,
                job_uid TEXT NOT NULL,
                pod_uid TEXT NOT NULL,
                model_version TEXT NOT NULL,
                table_version {bigint} NOT NULL,
                received_unix_s {real} NOT NULL,
                collective TEXT NOT NULL,
                size_bucket INTEGER NOT NULL,
                nbytes_min {bigint} NOT NULL,
                nbytes_max {bigint} NOT NULL,
                nranks INTEGER NOT NULL,
                nnodes INTEGER NOT NULL,
                algo TEXT NOT NULL,
                proto TEXT NOT NULL,
                nchannels INTEGER NOT NULL,
                chunk_bytes {bigint} NOT NULL,
                origin TEXT NOT NULL,
                count {bigint} NOT NULL,
                mean_time_us {real} NOT NULL,
                p50_time_us {real} NOT NULL,
                p99_time_us {real} NOT NULL,
                busbw_gbps {real} NOT NULL,
                nccl_default_time_us {real} NOT NULL)""",
            "CREATE INDEX experience_job_uid ON experience (job_uid)",
            "CREATE INDEX experience_received ON experience (received_unix_s)",
        ),
    ),
    Migration(
        2,
        "model registry",
        (
            """CREATE TABLE models (
                version TEXT PRIMARY KEY,
                sha256 TEXT NOT NULL,
                uri TEXT NOT NULL,
                parent TEXT,
                status TEXT NOT NULL,
                created_unix_s {real} NOT NULL,
                status_changed_unix_s {real} NOT NULL,
                metrics_json TEXT NOT NULL,
                experience_cursor {bigint} NOT NULL DEFAULT 0)""",
            "CREATE INDEX models_status ON models (status)",
        ),
    ),
    Migration(
        3,
        "online-tuner events; experience by model version",
        (
            """CREATE TABLE events (
                id {id},
                idempotency_key TEXT NOT NULL,
                job_uid TEXT NOT NULL,
                kind TEXT NOT NULL,
                collective TEXT NOT NULL,
                size_bucket INTEGER NOT NULL,
                nbytes_min {bigint} NOT NULL,
                nbytes_max {bigint} NOT NULL,
                call_index {bigint} NOT NULL,
                regression {real} NOT NULL,
                message TEXT NOT NULL,
                received_unix_s {real} NOT NULL)""",
            "CREATE INDEX events_job_uid ON events (job_uid)",
            "CREATE INDEX experience_model_job ON experience (model_version, job_uid)",
        ),
    ),
    Migration(
        4,
        "env-knob experiment: the knob arm each job ran with",
        (
            """CREATE TABLE job_knobs (
                job_uid TEXT PRIMARY KEY,
                policy TEXT NOT NULL,
                cohort TEXT NOT NULL,
                cohort_description TEXT NOT NULL,
                arm TEXT NOT NULL,
                recorded_unix_s {real} NOT NULL)""",
            "CREATE INDEX job_knobs_policy_cohort ON job_knobs (policy, cohort)",
        ),
    ),
    Migration(
        5,
        "job state features stored with the experience (what a retrain conditions on)",
        (
            """CREATE TABLE job_features (
                job_uid TEXT PRIMARY KEY,
                namespace TEXT NOT NULL,
                job_name TEXT NOT NULL,
                hardware_class TEXT NOT NULL,
                schema_version INTEGER NOT NULL,
                features_json TEXT NOT NULL,
                recorded_unix_s {real} NOT NULL)""",
            "CREATE INDEX job_features_class ON job_features (hardware_class)",
        ),
    ),
    Migration(
        6,
        "step times per batch (issue 31); changes refused for making the step slower",
        (
            """CREATE TABLE step_times (
                id {id},
                idempotency_key TEXT NOT NULL,
                namespace TEXT NOT NULL,
                job_uid TEXT NOT NULL,
                pod_uid TEXT NOT NULL,
                table_version {bigint} NOT NULL,
                status TEXT NOT NULL,
                steps {bigint} NOT NULL,
                median_us {real},
                spread_us {real},
                received_unix_s {real} NOT NULL)""",
            "CREATE INDEX step_times_job ON step_times (job_uid, pod_uid, table_version)",
            "CREATE INDEX step_times_received ON step_times (received_unix_s)",
            """CREATE TABLE step_refusals (
                job_uid TEXT NOT NULL,
                namespace TEXT NOT NULL,
                collective TEXT NOT NULL,
                size_bucket INTEGER NOT NULL,
                nranks INTEGER NOT NULL,
                nnodes INTEGER NOT NULL,
                algo TEXT NOT NULL,
                proto TEXT NOT NULL,
                nchannels INTEGER NOT NULL,
                chunk_bytes {bigint} NOT NULL,
                table_version {bigint} NOT NULL,
                reference_version {bigint} NOT NULL,
                step_slowdown {real} NOT NULL,
                kernel_speedup {real} NOT NULL,
                pods_slower INTEGER NOT NULL,
                pods_measured INTEGER NOT NULL,
                received_unix_s {real} NOT NULL,
                PRIMARY KEY (job_uid, collective, size_bucket, nranks, nnodes, algo, proto,
                             nchannels, chunk_bytes))""",
        ),
    ),
    Migration(
        7,
        "the calls per step of stored step times (versions are compared at the same period)",
        ("ALTER TABLE step_times ADD COLUMN period {bigint}",),
    ),
    Migration(
        8,
        "canary jobs' arms: cells where they explore the promoted version's choice (issue 29)",
        (
            """CREATE TABLE job_arms (
                job_uid TEXT NOT NULL,
                model_version TEXT NOT NULL,
                baseline_version TEXT NOT NULL,
                collective TEXT NOT NULL,
                size_bucket INTEGER NOT NULL,
                scale INTEGER NOT NULL,
                algo TEXT NOT NULL,
                proto TEXT NOT NULL,
                nchannels INTEGER NOT NULL,
                chunk_bytes {bigint} NOT NULL,
                base_algo TEXT NOT NULL,
                base_proto TEXT NOT NULL,
                base_nchannels INTEGER NOT NULL,
                base_chunk_bytes {bigint} NOT NULL,
                recorded_unix_s {real} NOT NULL,
                PRIMARY KEY (job_uid, collective, size_bucket, scale))""",
            "CREATE INDEX job_arms_versions ON job_arms (model_version, baseline_version)",
        ),
    ),
)

LATEST_VERSION: Final = MIGRATIONS[-1].version


def _check_order(migrations: Sequence[Migration]) -> None:
    for i, m in enumerate(migrations, start=1):
        if m.version != i:
            raise ValueError(f"migration #{i} has version {m.version}; versions must be 1..n")


_check_order(MIGRATIONS)


def current_version(cur: Cursor) -> int:
    """Highest applied version (0 for an empty database). Needs `schema_version`."""
    cur.execute("SELECT MAX(version) FROM schema_version")
    row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def apply_migrations(
    transaction: Callable[[], AbstractContextManager[Cursor]],
    dialect: Dialect,
    *,
    target: int = LATEST_VERSION,
    migrations: Sequence[Migration] = MIGRATIONS,
    clock: Callable[[], float] = time.time,
) -> list[int]:
    """Bring the schema to `target`; returns the versions applied by this call.

    `transaction()` opens a write transaction and yields its cursor (commit on
    normal exit, rollback on an exception).
    """
    if not 0 <= target <= len(migrations):
        raise ValueError(f"target schema version {target} is not in 0..{len(migrations)}")
    types = _TYPES[dialect]
    with transaction() as cur:
        _lock(cur, dialect)
        cur.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            "version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
            f"applied_unix_s {types['real']} NOT NULL)"
        )
    applied: list[int] = []
    for m in migrations[:target]:
        with transaction() as cur:
            _lock(cur, dialect)
            cur.execute("SELECT 1 FROM schema_version WHERE version = ?", (m.version,))
            if cur.fetchone() is not None:
                continue
            for stmt in m.render(dialect):
                cur.execute(stmt)
            cur.execute(
                "INSERT INTO schema_version (version, description, applied_unix_s) "
                "VALUES (?, ?, ?)",
                (m.version, m.description, clock()),
            )
            applied.append(m.version)
    return applied


def _lock(cur: Cursor, dialect: Dialect) -> None:
    if dialect is Dialect.POSTGRES:
        cur.execute("SELECT pg_advisory_xact_lock(?)", (PG_MIGRATION_LOCK_KEY,))
