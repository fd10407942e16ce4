"""The learning loop's features step: each reporting job's state features into the store.

A canary job's arms (`spec.arms`: where its table explores the promoted version's
choice) are stored with them (operator/store/arms.py), for the canary judge.

The TuningRuns the tick's status sync just patched (jobs whose first or later
rewards arrived; the patch returns the object, no extra API call) carry the
features the operator tuned the job with (`spec.features`). They are stored
once per job (`operator/store/features.py`, first write wins) with their
schema version, as they are: features that fail validation are stored too, so
the retrain counts the job's rows as `invalid_features` instead of
`no_features` (a bug to look at, not a job without a TuningRun).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pydantic import ValidationError

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.tuning_run import Arm
from dynamiccl.operator.store.arms import record_arms
from dynamiccl.operator.store.experience import ExperienceStore
from dynamiccl.operator.store.features import record_features
from dynamiccl.policy.online.knob_experiment import cohort_of

log = logging.getLogger("dynamiccl.operator.learning.features_sync")
UNKNOWN_CLASS: Final = "unknown"


def hardware_class(features: Mapping[str, Any]) -> str:
    """The job's hardware class (its env-knob cohort id), `unknown` for invalid features."""
    try:
        return cohort_of(StateFeatures.model_validate(features))[0]
    except ValidationError:
        return UNKNOWN_CLASS


def record_from_runs(
    store: ExperienceStore, runs: Iterable[Mapping[str, Any]], *, now: float
) -> int:
    """Store the features of every run that has them; returns how many were new."""
    written = 0
    for run in runs:
        spec = run.get("spec") or {}
        meta = run.get("metadata") or {}
        ref = spec.get("jobRef") or {}
        features = spec.get("features")
        uid = ref.get("uid")
        if not uid or not isinstance(features, Mapping):
            continue
        try:
            written += record_features(
                store.backend,
                job_uid=str(uid),
                namespace=str(meta.get("namespace") or ref.get("namespace") or ""),
                job_name=str(ref.get("name") or ""),
                hardware_class=hardware_class(features),
                features=features,
                now=now,
            )
        except ValueError as exc:  # oversized: not stored, the job's rows count as no_features
            log.warning("features of job %s not stored: %s", uid, exc)
        _record_arms(store, str(uid), spec, now)
    return written


def _record_arms(store: ExperienceStore, uid: str, spec: Mapping[str, Any], now: float) -> None:
    """A canary job's arms (the cells where it explores the promoted version's choice), for
    the canary judge's comparison inside the job (operator/store/arms.py)."""
    baseline, version, raw = spec.get("armsBaseline"), spec.get("modelVersion"), spec.get("arms")
    if not raw or not isinstance(baseline, str) or not isinstance(version, str):
        return
    try:
        arms = [Arm.model_validate(a) for a in raw]
    except (ValidationError, TypeError) as exc:  # the operator wrote it: a bug to look at
        log.warning("arms of job %s not stored: %s", uid, exc)
        return
    record_arms(
        store.backend, job_uid=uid, model_version=version, baseline_version=baseline,
        arms=arms, now=now,
    )  # fmt: skip
