"""Canary jobs' arms in the experience store (table `job_arms`, migration 8; issue 29).

A canary job's table explores the promoted version's choice where the two
versions choose otherwise (policy/runtime/arms.py); its TuningRun lists those
cells (`spec.arms`, written by the operator, never by a pod). The learning loop
stores them from the TuningRun the first time the job's rewards are synced, as
it stores the job's features (the first write wins: a job's arms are those its
table was compiled with). `arm_jobs` hands the canary judge, per job with arms,
the arms and the job's experience per (cell, configuration), for the comparison
inside the job (operator/learning/within_job.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from dynamiccl.api.learning import Config, ConfigKey
from dynamiccl.api.rewards import Origin
from dynamiccl.api.tuning_run import Arm
from dynamiccl.operator.store.backend import Backend

_INSERT: Final = (
    "INSERT INTO job_arms (job_uid, model_version, baseline_version, collective, size_bucket, "
    "scale, algo, proto, nchannels, chunk_bytes, base_algo, base_proto, base_nchannels, "
    "base_chunk_bytes, recorded_unix_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (job_uid, collective, size_bucket, scale) DO NOTHING"
)


def record_arms(
    backend: Backend,
    *,
    job_uid: str,
    model_version: str,
    baseline_version: str,
    arms: Sequence[Arm],
    now: float,
) -> int:
    """Store the job's arms unless some are stored already; how many rows were written."""
    if not arms or not baseline_version:
        return 0
    written = 0
    with backend.transaction() as cur:
        cur.execute("SELECT 1 FROM job_arms WHERE job_uid = ? LIMIT 1", (job_uid,))
        if cur.fetchone() is not None:
            return 0
        for a in arms:
            c, b = a.choice, a.baseline
            cur.execute(
                _INSERT,
                (job_uid, model_version, baseline_version, a.collective, a.size_bucket, a.scale,
                 c.algo, c.proto, c.nchannels, c.chunk_bytes,
                 b.algo, b.proto, b.nchannels, b.chunk_bytes, now),
            )  # fmt: skip
            written += max(cur.rowcount, 0)
    return written


@dataclass(frozen=True)
class ConfigTime:
    """A job's calls of one configuration in one cell (any origin), and of them exploratory."""

    collective: str
    size_bucket: int
    nranks: int
    nnodes: int
    config: ConfigKey
    calls: int
    explore_calls: int
    time_us: float  # summed over the calls
    explore_time_us: float


@dataclass(frozen=True)
class ArmJob:
    """A canary job with arms: the arms and its experience under the canary version."""

    job_uid: str
    arms: tuple[Arm, ...]
    times: tuple[ConfigTime, ...]


def arm_jobs(
    backend: Backend, model_version: str, baseline_version: str, since_unix_s: float | None = None
) -> list[ArmJob]:
    """Every job of `model_version` with arms against `baseline_version`, by job uid."""
    with backend.transaction(write=False) as cur:
        cur.execute(
            "SELECT job_uid, collective, size_bucket, scale, algo, proto, nchannels, chunk_bytes, "
            "base_algo, base_proto, base_nchannels, base_chunk_bytes FROM job_arms "
            "WHERE model_version = ? AND baseline_version = ?",
            (model_version, baseline_version),
        )
        arm_rows = cur.fetchall()
        sql = (
            "SELECT e.job_uid, e.collective, e.size_bucket, e.nranks, e.nnodes, e.algo, e.proto, "
            "e.nchannels, e.chunk_bytes, SUM(e.count), "
            "SUM(CASE WHEN e.origin = ? THEN e.count ELSE 0 END), SUM(e.count * e.mean_time_us), "
            "SUM(CASE WHEN e.origin = ? THEN e.count * e.mean_time_us ELSE 0 END) "
            "FROM experience e WHERE e.model_version = ? AND e.job_uid IN "
            "(SELECT DISTINCT job_uid FROM job_arms WHERE model_version = ? "
            "AND baseline_version = ?)"
        )
        explore = Origin.EXPLORE.value
        params: list[object] = [explore, explore, model_version, model_version, baseline_version]
        if since_unix_s is not None:
            sql += " AND e.received_unix_s >= ?"
            params.append(since_unix_s)
        sql += (
            " GROUP BY e.job_uid, e.collective, e.size_bucket, e.nranks, e.nnodes, e.algo, "
            "e.proto, e.nchannels, e.chunk_bytes"
        )
        cur.execute(sql, params)
        time_rows = cur.fetchall()
    arms: dict[str, list[Arm]] = {}
    for r in arm_rows:
        arms.setdefault(str(r[0]), []).append(Arm(
            collective=str(r[1]), size_bucket=int(r[2]), scale=int(r[3]),
            choice=Config(algo=str(r[4]), proto=str(r[5]), nchannels=int(r[6]),
                          chunk_bytes=int(r[7])),
            baseline=Config(algo=str(r[8]), proto=str(r[9]), nchannels=int(r[10]),
                            chunk_bytes=int(r[11])),
        ))  # fmt: skip
    times: dict[str, list[ConfigTime]] = {}
    for r in time_rows:
        times.setdefault(str(r[0]), []).append(
            ConfigTime(str(r[1]), int(r[2]), int(r[3]), int(r[4]),
                       (str(r[5]), str(r[6]), int(r[7]), int(r[8])),
                       int(r[9]), int(r[10]), float(r[11]), float(r[12]))
        )  # fmt: skip
    return [
        ArmJob(uid, tuple(sorted(arms[uid], key=lambda a: (a.collective, a.size_bucket, a.scale))),
               tuple(times.get(uid, ())))
        for uid in sorted(arms)
    ]  # fmt: skip
