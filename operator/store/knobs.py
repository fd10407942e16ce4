"""The env-knob experiment's data in the experience store (table `job_knobs`, migration 4).

The learning loop records which arm (knob values) each tuned job ran with —
read from its TuningRun, which goes away with the job — so the comparison
survives the jobs. `bucket_times` aggregates each recorded job's experience
per (collective, size bucket, ranks, nodes), exploratory calls left out (they
measure the online tuner's probes, not the job's knobs).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from dynamiccl.api.rewards import Origin
from dynamiccl.operator.store.experience import ExperienceStore
from dynamiccl.policy.online.knob_experiment import JobBucketTime

_INSERT: Final = (
    "INSERT INTO job_knobs (job_uid, policy, cohort, cohort_description, arm, recorded_unix_s) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_uid) DO NOTHING"
)


@dataclass(frozen=True)
class JobKnobs:
    """The arm one job ran with, in its policy's experiment on its cohort."""

    job_uid: str
    policy: str
    cohort: str
    cohort_description: str
    arm: str


def record(store: ExperienceStore, rows: Sequence[JobKnobs], *, now: float | None = None) -> int:
    """Store the jobs not recorded yet (a job's first record stands); how many were new."""
    if not rows:
        return 0
    at = time.time() if now is None else now
    new = 0
    with store.backend.transaction() as cur:
        for r in rows:
            cur.execute(_INSERT, (r.job_uid, r.policy, r.cohort, r.cohort_description, r.arm, at))
            new += max(cur.rowcount, 0)
    return new


def assignments(store: ExperienceStore, policy: str) -> list[JobKnobs]:
    """Every recorded job of a policy, by cohort then job uid."""
    with store.backend.transaction(write=False) as cur:
        cur.execute(
            "SELECT job_uid, policy, cohort, cohort_description, arm FROM job_knobs "
            "WHERE policy = ? ORDER BY cohort, job_uid",
            (policy,),
        )
        return [JobKnobs(*(str(x) for x in r)) for r in cur.fetchall()]


def bucket_times(store: ExperienceStore, policy: str) -> list[JobBucketTime]:
    """Per recorded job and bucket: calls and call-weighted mean time (no exploration)."""
    with store.backend.transaction(write=False) as cur:
        cur.execute(
            "SELECT e.job_uid, e.collective, e.size_bucket, e.nranks, e.nnodes, SUM(e.count), "
            "SUM(e.count * e.mean_time_us) FROM experience e "
            "JOIN job_knobs k ON k.job_uid = e.job_uid "
            "WHERE k.policy = ? AND e.origin <> ? "
            "GROUP BY e.job_uid, e.collective, e.size_bucket, e.nranks, e.nnodes "
            "ORDER BY e.job_uid, e.collective, e.size_bucket, e.nranks, e.nnodes",
            (policy, Origin.EXPLORE.value),
        )
        rows = cur.fetchall()
    out = []
    for job, coll, size, nranks, nnodes, calls, total in rows:
        if int(calls) > 0:
            bucket = (str(coll), int(size), int(nranks), int(nnodes))
            out.append(JobBucketTime(str(job), bucket, int(calls), float(total) / int(calls)))
    return out
