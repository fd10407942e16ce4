"""Step times and step-refused changes in the experience store (issue 31; SQL only).

Every reward batch that carries `steps` (dynamiccl/api/rewards.py `StepTimes`: the
training step the pod's sidecar measured under the batch's table version) is one
`step_times` row, written in the batch's transaction (operator/store/experience.py),
so a batch's step times are stored exactly when its records are. The snapshots are
cumulative (steps so far, their median): `job_steps` reads, per (pod, table
version), the latest one, and per pod its latest status.

`step_refusals` holds the changes the learning loop refused to learn for a job: a
cell's new configuration under which its collectives got faster while the job's
steps got slower (operator/learning/step_verdicts.py decides; `record_refusals`
writes them; findings and retraining read them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from dynamiccl.api.learning import ConfigKey
from dynamiccl.api.rewards import RewardBatch, StepStatus
from dynamiccl.operator.store.backend import Backend, StoreCursor

INSERT_STEP_TIMES: Final = (
    "INSERT INTO step_times (idempotency_key, namespace, job_uid, pod_uid, table_version, "
    "status, steps, median_us, spread_us, period, received_unix_s) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_REFUSAL_COLS: Final = (
    "job_uid, namespace, collective, size_bucket, nranks, nnodes, algo, proto, nchannels, "
    "chunk_bytes, table_version, reference_version, step_slowdown, kernel_speedup, pods_slower, "
    "pods_measured, received_unix_s"
)
Cell = tuple[str, int, int, int]  # (collective, size bucket, nranks, nnodes)


def step_row(b: RewardBatch, now: float) -> tuple[object, ...] | None:
    """The `step_times` row of a batch (None: the batch carries no step times)."""
    s = b.steps
    if s is None:
        return None
    return (
        b.idempotency_key, b.job.namespace, b.job.uid, b.pod.uid, b.table_version,
        s.status.value, s.steps, s.median_us, s.spread_us, s.period, now,
    )  # fmt: skip


def insert_step_rows(cur: StoreCursor, batches: Sequence[RewardBatch], now: float) -> None:
    """Write the step times of the batches (inside the caller's transaction)."""
    rows = [r for b in batches if (r := step_row(b, now)) is not None]
    if rows:
        cur.executemany(INSERT_STEP_TIMES, rows)


@dataclass(frozen=True)
class PodSteps:
    """A pod's latest snapshot of the steps it measured under one table version."""

    pod_uid: str
    table_version: int
    steps: int
    median_us: float
    spread_us: float
    period: int | None = None  # calls per step (None: a sender before periods were sent)


@dataclass(frozen=True)
class JobSteps:
    """What a job's pods said about its training step."""

    status: dict[str, StepStatus]  # per pod: its latest batch's step status
    versions: list[PodSteps]  # per (pod, table version) with steps measured


def _int(v: object) -> int | None:
    return None if v is None else int(str(v))


def job_steps(backend: Backend, job_uid: str) -> JobSteps:
    """The job's latest step status per pod and latest step snapshot per (pod, version)."""
    with backend.transaction(write=False) as cur:
        cur.execute(
            "SELECT s.pod_uid, s.status FROM step_times s JOIN (SELECT MAX(id) AS id FROM "
            "step_times WHERE job_uid = ? GROUP BY pod_uid) m ON m.id = s.id",
            (job_uid,),
        )
        status = {str(r[0]): StepStatus(str(r[1])) for r in cur.fetchall()}
        cur.execute(
            "SELECT s.pod_uid, s.table_version, s.steps, s.median_us, s.spread_us, s.period "
            "FROM step_times s JOIN (SELECT MAX(id) AS id FROM step_times "
            "WHERE job_uid = ? AND steps > 0 GROUP BY pod_uid, table_version) m ON m.id = s.id "
            "ORDER BY s.pod_uid, s.table_version",
            (job_uid,),
        )
        versions = [
            PodSteps(str(r[0]), int(r[1]), int(r[2]), float(r[3]), float(r[4] or 0.0), _int(r[5]))
            for r in cur.fetchall()
        ]
    return JobSteps(status, versions)


@dataclass(frozen=True)
class VersionCell:
    """A job's calls of one configuration in one cell under one table version (all pods)."""

    table_version: int
    cell: Cell
    config: ConfigKey
    origin: str
    calls: int
    time_us: float  # summed over calls


def version_cells(backend: Backend, job_uid: str) -> list[VersionCell]:
    """Every (table version, cell, configuration, origin) group of the job's experience."""
    with backend.transaction(write=False) as cur:
        cur.execute(
            "SELECT table_version, collective, size_bucket, nranks, nnodes, algo, proto, "
            "nchannels, chunk_bytes, origin, SUM(count), SUM(count * mean_time_us) "
            "FROM experience WHERE job_uid = ? GROUP BY table_version, collective, size_bucket, "
            "nranks, nnodes, algo, proto, nchannels, chunk_bytes, origin",
            (job_uid,),
        )
        rows = cur.fetchall()
    return [
        VersionCell(
            int(r[0]),
            (str(r[1]), int(r[2]), int(r[3]), int(r[4])),
            (str(r[5]), str(r[6]), int(r[7]), int(r[8])),
            str(r[9]),
            int(r[10]),
            float(r[11]),
        )
        for r in rows
    ]


@dataclass(frozen=True)
class Refusal:
    """A change the learning loop does not learn from: in `cell`, `config` made the job's
    collectives `kernel_speedup` times faster than the reference version's configuration
    and its median step `step_slowdown` slower (a share: 0.07 = 7 % slower)."""

    cell: Cell
    config: ConfigKey
    table_version: int
    reference_version: int
    step_slowdown: float
    kernel_speedup: float
    pods_slower: int
    pods_measured: int


def record_refusals(
    backend: Backend, job_uid: str, namespace: str, refusals: Sequence[Refusal], now: float
) -> int:
    """Store the job's refusals (a (cell, configuration) refused before keeps its first
    verdict); the number new."""
    rows = [
        (job_uid, namespace, *r.cell, *r.config, r.table_version, r.reference_version,
         r.step_slowdown, r.kernel_speedup, r.pods_slower, r.pods_measured, now)
        for r in refusals
    ]  # fmt: skip
    added = 0
    with backend.transaction() as cur:
        for row in rows:
            cur.execute(
                f"INSERT INTO step_refusals ({_REFUSAL_COLS}) VALUES "
                f"({', '.join('?' * 17)}) ON CONFLICT DO NOTHING",
                row,
            )
            added += max(cur.rowcount, 0)
    return added


def refusals(backend: Backend, job_uid: str | None = None) -> list[tuple[str, Refusal]]:
    """(job uid, refusal) of every stored refusal (or one job's)."""
    sql = f"SELECT {_REFUSAL_COLS} FROM step_refusals"
    params: tuple[object, ...] = ()
    if job_uid is not None:
        sql += " WHERE job_uid = ?"
        params = (job_uid,)
    with backend.transaction(write=False) as cur:
        cur.execute(sql + " ORDER BY received_unix_s, job_uid", params)
        rows = cur.fetchall()
    return [
        (
            str(r[0]),
            Refusal(
                (str(r[2]), int(r[3]), int(r[4]), int(r[5])),
                (str(r[6]), str(r[7]), int(r[8]), int(r[9])),
                int(r[10]), int(r[11]), float(r[12]), float(r[13]), int(r[14]), int(r[15]),
            ),
        )
        for r in rows
    ]  # fmt: skip
