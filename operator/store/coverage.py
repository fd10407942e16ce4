"""Measured experience per hardware class and cell, for exploration coverage (read-only SQL).

One grouped scan of `experience` joined with `job_features` (schema version 5):
per (hardware class, nranks, nnodes, collective, size bucket, configuration)
the calls (in all, as NCCL's own decision, as the table's choice), the summed
measured time, the summed NCCL-default time and the number of jobs. Rows of
jobs without stored features have no class and are left out. The learning
loop folds these into `status.learning` (operator/learning/learning_status.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from dynamiccl.operator.store.backend import Backend

_SQL: Final = (
    "SELECT f.hardware_class, e.nranks, e.nnodes, e.collective, e.size_bucket, e.algo, e.proto, "
    "e.nchannels, e.chunk_bytes, SUM(e.count), SUM(e.count * e.mean_time_us), "
    "SUM(e.count * e.nccl_default_time_us), COUNT(DISTINCT e.job_uid), "
    "SUM(CASE WHEN e.origin = 'default' THEN e.count ELSE 0 END), "
    "SUM(CASE WHEN e.origin = 'table' THEN e.count ELSE 0 END) "
    "FROM experience e JOIN job_features f ON f.job_uid = e.job_uid "
    "GROUP BY f.hardware_class, e.nranks, e.nnodes, e.collective, e.size_bucket, e.algo, "
    "e.proto, e.nchannels, e.chunk_bytes"
)


@dataclass(frozen=True)
class Measured:
    """One configuration of one cell of one hardware class (every origin)."""

    hardware_class: str
    nranks: int
    nnodes: int
    collective: str
    size_bucket: int
    algo: str
    proto: str
    nchannels: int
    chunk_bytes: int
    calls: int
    time_us: float  # summed over calls
    nccl_default_us: float  # summed over calls
    jobs: int
    own_calls: int  # calls NCCL decided itself (origin default)
    table_calls: int  # calls that ran it as the table's choice (origin table)


def measured(backend: Backend) -> list[Measured]:
    """Every (class, cell, configuration) group of the stored experience."""
    with backend.transaction(write=False) as cur:
        cur.execute(_SQL)
        rows = cur.fetchall()
    types = (str, int, int, str, int, str, str, int, int, int, float, float, int, int, int)
    return [Measured(*(t(v) for t, v in zip(types, r, strict=True))) for r in rows]


def class_jobs(backend: Backend) -> dict[str, int]:
    """Jobs with stored features, per hardware class."""
    with backend.transaction(write=False) as cur:
        cur.execute("SELECT hardware_class, COUNT(*) FROM job_features GROUP BY hardware_class")
        return {str(r[0]): int(r[1]) for r in cur.fetchall()}


def job_configs(backend: Backend, job_uid: str) -> list[tuple[object, ...]]:
    """One job's (collective, bucket, nranks, nnodes, algo, proto, nchannels, chunk, origin,
    calls, summed time, summed NCCL-default time) groups."""
    with backend.transaction(write=False) as cur:
        cur.execute(
            "SELECT collective, size_bucket, nranks, nnodes, algo, proto, nchannels, chunk_bytes, "
            "origin, SUM(count), SUM(count * mean_time_us), SUM(count * nccl_default_time_us) "
            "FROM experience WHERE job_uid = ? GROUP BY collective, size_bucket, nranks, nnodes, "
            "algo, proto, nchannels, chunk_bytes, origin",
            (job_uid,),
        )
        return [tuple(r) for r in cur.fetchall()]
