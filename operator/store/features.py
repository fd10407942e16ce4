"""Each job's state features, stored once beside its experience (schema version 5).

A retrain conditions every reward record on the features of the job that
measured it (topology, tiers, workload): without them a record teaches
nothing. The learning loop stores them from the job's TuningRun (`spec.features`,
written by the operator when it tuned the job) the first time the job's rewards
are synced; the first write wins (a job's features are those it was tuned
with). `schema_version` is `StateFeatures.version` as written: a reader that
does not know it skips the job's rows and counts them
(policy/train/offline.py). `hardware_class` is the job's hardware cohort
(`policy.online.knob_experiment.cohort_of`): what exploration coverage and the
policy's per-class status are keyed by.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from dynamiccl.operator.store.backend import Backend

_INSERT: Final = (
    "INSERT INTO job_features (job_uid, namespace, job_name, hardware_class, schema_version, "
    "features_json, recorded_unix_s) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (job_uid) DO NOTHING"
)
MAX_FEATURES_BYTES: Final = 64 * 1024


def record_features(
    backend: Backend,
    *,
    job_uid: str,
    namespace: str,
    job_name: str,
    hardware_class: str,
    features: Mapping[str, Any],
    now: float,
) -> bool:
    """Store the job's features unless already stored; True when written now.

    `features` is the JSON form of `StateFeatures` (as the TuningRun carries
    it); its `version` key is the schema version (1 when absent, the first one).
    """
    text = json.dumps(dict(features), sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_FEATURES_BYTES:
        raise ValueError(
            f"features of job {job_uid} are {len(text)} bytes (> {MAX_FEATURES_BYTES})"
        )
    raw_version = features.get("version", 1)
    version = raw_version if isinstance(raw_version, int) else -1
    with backend.transaction() as cur:
        cur.execute(_INSERT, (job_uid, namespace, job_name, hardware_class, version, text, now))
        return cur.rowcount == 1


def _first_row(backend: Backend, sql: str, params: tuple[str, ...]) -> tuple[Any, ...] | None:
    with backend.transaction(write=False) as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def stored_features(backend: Backend, job_uid: str) -> tuple[int, str, str] | None:
    """(schema version, hardware class, features JSON) of a job, or None."""
    row = _first_row(
        backend,
        "SELECT schema_version, hardware_class, features_json FROM job_features WHERE job_uid = ?",
        (job_uid,),
    )
    return None if row is None else (int(row[0]), str(row[1]), str(row[2]))


def class_features(backend: Backend, hardware_class: str) -> str | None:
    """The features JSON of one job of a hardware class (every job of a class shares its
    nodes' shape: fabric, NICs, GPUs), or None when none is stored."""
    row = _first_row(
        backend,
        "SELECT features_json FROM job_features WHERE hardware_class = ? ORDER BY job_uid LIMIT 1",
        (hardware_class,),
    )
    return None if row is None else str(row[0])
