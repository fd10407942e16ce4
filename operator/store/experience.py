"""The experience store: every accepted reward, exactly once, durably.

`open_store(url)` opens SQLite (a path or `sqlite:///path`; WAL,
synchronous=FULL, one writer) or PostgreSQL (`postgresql://...`), and brings
the schema to the latest version (operator/store/migrations.py).

Idempotency (docs/learning-loop.md, 'Reward batches' and 'Endpoint answers'): a
batch's idempotency key is the primary key of `batches`; its rows and the key
are written in one transaction. A retry of the same batch (same key, same
payload digest) returns `duplicate` and writes nothing; the same key with
another payload raises `IdempotencyConflict` and writes nothing.
`insert_batches` commits several batches with one commit (one fsync) — the
ingest endpoint's group commit — each still all-or-nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dynamiccl.api.experience import RECORD_FIELDS, SELECT_EXPERIENCE, row_to_experience
from dynamiccl.api.rewards import (
    ExperienceRow,
    JobRewardSummary,
    Origin,
    RewardBatch,
    TunerEvent,
    payload_sha256,
)
from dynamiccl.operator.store.backend import Backend, open_backend
from dynamiccl.operator.store.migrations import LATEST_VERSION, apply_migrations, current_version
from dynamiccl.operator.store.steps import insert_step_rows
from dynamiccl.operator.store.summary import JobOutcome, summarise

DEFAULT_PAGE: Final = 10_000


class IdempotencyConflict(Exception):  # noqa: N818 - a domain outcome, not a bug
    """The idempotency key was already used for a different payload."""

    def __init__(self, key: str) -> None:
        super().__init__(f"idempotency key {key!r} was already used for a different payload")
        self.key = key


@dataclass(frozen=True)
class InsertOutcome:
    """What storing one batch did."""

    accepted: int  # records written (0 for a duplicate)
    duplicate: bool


@dataclass(frozen=True)
class RetentionResult:
    """Rows deleted by one retention pass."""

    experience: int
    events: int
    batches: int
    step_times: int = 0
    step_refusals: int = 0


_EXPERIENCE_COLS: Final = (
    "idempotency_key, namespace, job_kind, job_name, job_uid, pod_uid, model_version, "
    "table_version, received_unix_s, collective, size_bucket, nbytes_min, nbytes_max, nranks, "
    "nnodes, algo, proto, nchannels, chunk_bytes, origin, count, mean_time_us, p50_time_us, "
    "p99_time_us, busbw_gbps, nccl_default_time_us"
)
_INSERT_EXPERIENCE: Final = (
    f"INSERT INTO experience ({_EXPERIENCE_COLS}) VALUES ({', '.join(['?'] * 26)})"
)
_INSERT_BATCH: Final = (
    "INSERT INTO batches (idempotency_key, payload_sha256, namespace, job_kind, job_name, "
    "job_uid, pod_name, pod_uid, model_version, table_version, n_records, received_unix_s) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING"
)
_INSERT_EVENT: Final = (
    "INSERT INTO events (idempotency_key, job_uid, kind, collective, size_bucket, nbytes_min, "
    "nbytes_max, call_index, regression, message, received_unix_s) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _experience_rows(b: RewardBatch, now: float) -> list[tuple[Any, ...]]:
    head = (
        b.idempotency_key,
        b.job.namespace,
        b.job.kind,
        b.job.name,
        b.job.uid,
        b.pod.uid,
        b.model_version,
        b.table_version,
        now,
    )
    return [
        (
            *head,
            *(getattr(r, f) if f != "collective" else r.collective.value for f in RECORD_FIELDS),
        )
        for r in b.records
    ]


class ExperienceStore:
    """Reward batches, experience queries, job summaries, retention."""

    def __init__(self, backend: Backend, *, clock: Callable[[], float] = time.time) -> None:
        self.backend = backend
        self._clock = clock

    # --- schema -------------------------------------------------------------
    def migrate(self, target: int = LATEST_VERSION) -> list[int]:
        """Apply missing migrations up to `target`; the versions applied now."""
        return apply_migrations(self.backend.transaction, self.backend.dialect, target=target)

    def schema_version(self) -> int:
        with self.backend.transaction(write=False) as cur:
            return current_version(cur)

    def close(self) -> None:
        self.backend.close()

    # --- ingest -------------------------------------------------------------
    def insert_batch(self, batch: RewardBatch) -> InsertOutcome:
        """Store one batch exactly once; IdempotencyConflict on a reused key."""
        (out,) = self.insert_batches([batch])
        if isinstance(out, IdempotencyConflict):
            raise out
        return out

    def insert_batches(
        self, batches: Sequence[RewardBatch]
    ) -> list[InsertOutcome | IdempotencyConflict]:
        """Store several batches in one transaction (one commit); one outcome each.

        A database error rolls the whole transaction back and propagates: then
        nothing of any of the batches was written.
        """
        digests = [payload_sha256(b) for b in batches]
        outcomes: list[InsertOutcome | IdempotencyConflict] = []
        # keys in one order in every transaction: two ingest replicas committing groups that
        # share keys (a batch resent to another replica) wait for each other, never deadlock
        order = sorted(range(len(batches)), key=lambda i: batches[i].idempotency_key)
        with self.backend.transaction() as cur:
            now = self._clock()
            for b, digest in ((batches[i], digests[i]) for i in order):
                cur.execute(
                    _INSERT_BATCH,
                    (
                        b.idempotency_key,
                        digest,
                        b.job.namespace,
                        b.job.kind,
                        b.job.name,
                        b.job.uid,
                        b.pod.name,
                        b.pod.uid,
                        b.model_version,
                        b.table_version,
                        len(b.records),
                        now,
                    ),
                )
                if cur.rowcount != 1:
                    cur.execute(
                        "SELECT payload_sha256 FROM batches WHERE idempotency_key = ?",
                        (b.idempotency_key,),
                    )
                    row = cur.fetchone()
                    if row is not None and row[0] == digest:
                        outcomes.append(InsertOutcome(accepted=0, duplicate=True))
                    else:
                        outcomes.append(IdempotencyConflict(b.idempotency_key))
                    continue
                if b.records:
                    cur.executemany(_INSERT_EXPERIENCE, _experience_rows(b, now))
                if b.events:
                    cur.executemany(_INSERT_EVENT, [_event_row(b, e, now) for e in b.events])
                insert_step_rows(cur, [b], now)
                outcomes.append(InsertOutcome(accepted=len(b.records), duplicate=False))
        by_input: list[InsertOutcome | IdempotencyConflict] = outcomes.copy()
        for pos, i in enumerate(order):
            by_input[i] = outcomes[pos]
        return by_input

    # --- training queries ---------------------------------------------------
    def experience_since(
        self,
        after_id: int = 0,
        *,
        since_unix_s: float | None = None,
        limit: int = DEFAULT_PAGE,
    ) -> list[ExperienceRow]:
        """Rows with id > after_id (and received at/after since_unix_s), oldest first."""
        sql = f"{SELECT_EXPERIENCE} WHERE id > ?"
        params: list[object] = [after_id]
        if since_unix_s is not None:
            sql += " AND received_unix_s >= ?"
            params.append(since_unix_s)
        sql += " ORDER BY id LIMIT ?"
        params.append(limit)
        with self.backend.transaction(write=False) as cur:
            cur.execute(sql, params)
            return [row_to_experience(r) for r in cur.fetchall()]

    def experience_for_job(self, job_uid: str, *, limit: int = DEFAULT_PAGE) -> list[ExperienceRow]:
        with self.backend.transaction(write=False) as cur:
            cur.execute(
                f"{SELECT_EXPERIENCE} WHERE job_uid = ? ORDER BY id LIMIT ?", (job_uid, limit)
            )
            return [row_to_experience(r) for r in cur.fetchall()]

    def count_experience(self, after_id: int = 0) -> int:
        """Experience rows with id > after_id (new experience since a training cursor)."""
        return self._scalar_int("SELECT COUNT(*) FROM experience WHERE id > ?", (after_id,))

    def max_experience_id(self) -> int:
        return self._scalar_int("SELECT MAX(id) FROM experience")

    def stored_calls(self, job_uid: str | None = None) -> int:
        """Sum of `count` over stored records (all jobs, or one)."""
        if job_uid is None:
            return self._scalar_int("SELECT SUM(count) FROM experience")
        return self._scalar_int("SELECT SUM(count) FROM experience WHERE job_uid = ?", (job_uid,))

    def jobs_updated_since(self, since_unix_s: float) -> list[tuple[str, str, str, str]]:
        """(namespace, kind, name, uid) of every job with a batch received at/after the time."""
        with self.backend.transaction(write=False) as cur:
            cur.execute(
                "SELECT DISTINCT namespace, job_kind, job_name, job_uid FROM batches "
                "WHERE received_unix_s >= ? ORDER BY namespace, job_name, job_uid",
                (since_unix_s,),
            )
            return [(str(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in cur.fetchall()]

    def batch_count(self) -> int:
        return self._scalar_int("SELECT COUNT(*) FROM batches")

    def _scalar_int(self, sql: str, params: Sequence[object] = ()) -> int:
        with self.backend.transaction(write=False) as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    # --- summaries -----------------------------------------------------------
    def job_summary(self, job_uid: str) -> JobRewardSummary:
        """Everything the TuningRun status shows about the job's rewards."""
        with self.backend.transaction(write=False) as cur:
            cur.execute(
                "SELECT collective, size_bucket, nranks, nnodes, algo, proto, nchannels, "
                "chunk_bytes, origin, MIN(nbytes_min), MAX(nbytes_max), SUM(count), "
                "SUM(count * mean_time_us), SUM(count * nccl_default_time_us) FROM experience "
                "WHERE job_uid = ? GROUP BY collective, size_bucket, nranks, nnodes, algo, proto, "
                "nchannels, chunk_bytes, origin",
                (job_uid,),
            )
            groups = cur.fetchall()
            cur.execute(
                "SELECT COUNT(*), SUM(n_records), MAX(received_unix_s) FROM batches "
                "WHERE job_uid = ?",
                (job_uid,),
            )
            brow = cur.fetchone() or (0, 0, None)
            cur.execute(
                "SELECT kind, collective, size_bucket, nbytes_min, nbytes_max, call_index, "
                "regression, message FROM events WHERE job_uid = ? ORDER BY id DESC",
                (job_uid,),
            )
            events = cur.fetchall()
        return summarise(job_uid, groups, brow, events)

    def job_outcomes(
        self, model_versions: Sequence[str] | None = None, *, since_unix_s: float | None = None
    ) -> list[JobOutcome]:
        """Per (job, model version): calls, measured and NCCL-default time (no exploration),
        and the job's hardware class (its stored features; "" before they are).

        `since_unix_s` keeps only experience received from then on (e.g. since
        a canary started, so both sides of a comparison cover the same period).
        """
        sql = (
            "SELECT e.job_uid, e.model_version, SUM(e.count), SUM(e.count * e.mean_time_us), "
            "SUM(e.count * e.nccl_default_time_us), COALESCE(MAX(f.hardware_class), '') "
            "FROM experience e LEFT JOIN job_features f ON f.job_uid = e.job_uid "
            "WHERE e.origin <> ?"
        )
        params: list[object] = [Origin.EXPLORE.value]
        if since_unix_s is not None:
            sql += " AND e.received_unix_s >= ?"
            params.append(since_unix_s)
        if model_versions is not None:
            if not model_versions:
                return []
            sql += f" AND e.model_version IN ({', '.join('?' * len(model_versions))})"
            params.extend(model_versions)
        sql += " GROUP BY e.job_uid, e.model_version ORDER BY e.job_uid, e.model_version"
        with self.backend.transaction(write=False) as cur:
            cur.execute(sql, params)
            rows = cur.fetchall()
        return [
            JobOutcome(str(r[0]), str(r[1]), int(r[2]), float(r[3]), float(r[4]), str(r[5]))
            for r in rows
        ]

    # --- retention -----------------------------------------------------------
    def apply_retention(
        self, *, max_age_s: float | None = None, max_rows: int | None = None
    ) -> RetentionResult:
        """Delete experience older than `max_age_s` and beyond the newest `max_rows`.

        Idempotency keys (`batches`) go only by age: a key must outlive any
        retry of its batch, so `max_rows` never forgets one.
        """
        if max_rows is not None and max_rows < 0:
            raise ValueError(f"max_rows must be >= 0, got {max_rows}")
        deleted = {
            "experience": 0, "events": 0, "batches": 0, "step_times": 0, "step_refusals": 0,
        }  # fmt: skip
        with self.backend.transaction() as cur:
            if max_age_s is not None:
                cutoff = self._clock() - max_age_s
                for table in deleted:
                    cur.execute(f"DELETE FROM {table} WHERE received_unix_s < ?", (cutoff,))
                    deleted[table] += max(cur.rowcount, 0)
            if max_rows is not None:
                cur.execute(
                    "SELECT id FROM experience ORDER BY id DESC LIMIT 1 OFFSET ?", (max_rows,)
                )
                row = cur.fetchone()
                if row is not None:
                    cur.execute("DELETE FROM experience WHERE id <= ?", (row[0],))
                    deleted["experience"] += max(cur.rowcount, 0)
        return RetentionResult(**deleted)


def _event_row(b: RewardBatch, e: TunerEvent, now: float) -> tuple[object, ...]:
    return (
        b.idempotency_key,
        b.job.uid,
        e.kind.value,
        e.collective.value,
        e.size_bucket,
        e.nbytes_min,
        e.nbytes_max,
        e.call_index,
        e.regression,
        e.message,
        now,
    )


def open_store(
    url: str, *, migrate: bool = True, clock: Callable[[], float] = time.time
) -> ExperienceStore:
    """Open the store at `url`, migrating it to the latest schema unless told not to."""
    store = ExperienceStore(open_backend(url), clock=clock)
    if migrate:
        store.migrate()
    return store
