"""Per-job evidence of chosen cells, for cluster-wide findings (read-only SQL, issue 29).

`coverage.measured` pools a hardware class's experience over every job: one job
posting made-up rewards moves the pool as far as it likes. A finding must stand
on several independent jobs, so this reads the same experience per job: for the
cells asked about (collective, size bucket), per (hardware class, namespace,
job, nranks, nnodes, configuration) the calls (in all, as NCCL's own decision,
as the table's choice), the summed measured time, the summed NCCL-default time,
the call-weighted p99/p50 ratio (the job's own noise) and the job's first row
id in the cell (its order). `guardrail_reverts` lists the cells whose committed
choice a job's guardrail reverted to NCCL's default; `cell_outcomes` each job's
non-exploratory time per cell under a model version (the canary judge's cells).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from dynamiccl.api.learning import ConfigKey
from dynamiccl.api.rewards import EventKind, Origin
from dynamiccl.operator.store.backend import Backend

_SELECT: Final = (
    "SELECT f.hardware_class, e.namespace, e.job_uid, e.nranks, e.nnodes, e.collective, "
    "e.size_bucket, e.algo, e.proto, e.nchannels, e.chunk_bytes, SUM(e.count), "
    "SUM(e.count * e.mean_time_us), SUM(e.count * e.nccl_default_time_us), "
    "SUM(e.count * e.p99_time_us / e.p50_time_us), "
    "SUM(CASE WHEN e.origin = 'default' THEN e.count ELSE 0 END), "
    "SUM(CASE WHEN e.origin = 'table' THEN e.count ELSE 0 END), MIN(e.id) "
    "FROM experience e JOIN job_features f ON f.job_uid = e.job_uid "
)
_GROUP: Final = (
    " GROUP BY f.hardware_class, e.namespace, e.job_uid, e.nranks, e.nnodes, e.collective, "
    "e.size_bucket, e.algo, e.proto, e.nchannels, e.chunk_bytes"
)
MAX_CELLS_ASKED: Final = 256  # one query's parameters


@dataclass(frozen=True)
class JobMeasure:
    """One job's calls of one configuration in one cell of its hardware class."""

    hardware_class: str
    namespace: str
    job_uid: str
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
    p99_over_p50: float  # summed over calls
    own_calls: int  # origin default
    table_calls: int  # origin table
    first_id: int  # the job's first row of this configuration in the cell (order of jobs)

    @property
    def config(self) -> ConfigKey:
        return (self.algo, self.proto, self.nchannels, self.chunk_bytes)

    @property
    def cell(self) -> tuple[str, int, int, str, int]:
        return (self.hardware_class, self.nranks, self.nnodes, self.collective, self.size_bucket)


def cell_key(collective: str, size_bucket: int) -> str:
    """How a (collective, size bucket) is asked for."""
    return f"{collective}:{size_bucket}"


def job_measures(backend: Backend, cells: Iterable[tuple[str, int]]) -> list[JobMeasure]:
    """Every job's configurations in the asked (collective, size bucket) cells."""
    keys = sorted({cell_key(c, b) for c, b in cells})[:MAX_CELLS_ASKED]
    if not keys:
        return []
    where = (
        "WHERE e.collective || ':' || CAST(e.size_bucket AS TEXT) IN ("
        + ", ".join("?" for _ in keys)
        + ")"
    )
    with backend.transaction(write=False) as cur:
        cur.execute(_SELECT + where + _GROUP, tuple(keys))
        rows = cur.fetchall()
    types = (str, str, str, int, int, str, int, str, str, int, int, int, float, float, float,
             int, int, int)  # fmt: skip
    return [JobMeasure(*(t(v) for t, v in zip(types, r, strict=True))) for r in rows]


def guardrail_reverts(backend: Backend) -> set[tuple[str, str, int]]:
    """(job uid, collective, size bucket) of every guardrail revert a job reported."""
    with backend.transaction(write=False) as cur:
        cur.execute(
            "SELECT DISTINCT job_uid, collective, size_bucket FROM events WHERE kind = ?",
            (EventKind.GUARDRAIL_REVERT.value,),
        )
        return {(str(r[0]), str(r[1]), int(r[2])) for r in cur.fetchall()}


def class_namespaces(backend: Backend) -> dict[str, int]:
    """Namespaces with jobs (stored features), per hardware class."""
    with backend.transaction(write=False) as cur:
        cur.execute(
            "SELECT hardware_class, COUNT(DISTINCT namespace) FROM job_features "
            "GROUP BY hardware_class"
        )
        return {str(r[0]): int(r[1]) for r in cur.fetchall()}


@dataclass(frozen=True)
class CellOutcome:
    """One job's non-exploratory calls of one cell under one model version."""

    job_uid: str
    model_version: str
    cell: tuple[str, int, int, int]  # (collective, size bucket, nranks, nnodes)
    calls: int
    time_us: float  # summed over calls


def cell_outcomes(
    backend: Backend, model_versions: Sequence[str], since_unix_s: float | None = None
) -> list[CellOutcome]:
    """Per (job, model version, cell): the calls that were not exploration, and their time
    (what the canary judge compares cell by cell: operator/learning/promotion.py)."""
    if not model_versions:
        return []
    sql = (
        "SELECT job_uid, model_version, collective, size_bucket, nranks, nnodes, SUM(count), "
        "SUM(count * mean_time_us) FROM experience WHERE origin <> ? AND model_version IN ("
        + ", ".join("?" for _ in model_versions)
        + ")"
    )
    params: list[object] = [Origin.EXPLORE.value, *model_versions]
    if since_unix_s is not None:
        sql += " AND received_unix_s >= ?"
        params.append(since_unix_s)
    sql += " GROUP BY job_uid, model_version, collective, size_bucket, nranks, nnodes"
    with backend.transaction(write=False) as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
    out = []
    for r in rows:
        cell = (str(r[2]), int(r[3]), int(r[4]), int(r[5]))
        out.append(CellOutcome(str(r[0]), str(r[1]), cell, int(r[6]), float(r[7])))
    return out
