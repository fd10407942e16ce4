"""The learning loop's env-knob step: record each job's arm, compare, publish.

Every tick (operator/learning/loop.py):

1. every TuningRun the tick's status sync just patched (a job that reported
   rewards) gives (job uid, policy, cohort, the knob values its ranks actually
   ran with: the operator's, unless the user set the variable) — stored once
   per job in the experience store, so the comparison outlives the TuningRun
   (no extra API call: the patch returns the object);
2. for every `learned` policy that declares `envKnobs`, the recorded jobs of
   each cohort are compared (policy/online/knob_experiment.py) on the experience the
   store holds for them, over the arms that can matter on the cohort's nodes
   (policy/online/knob_scope.py, judged on the stored features of one of its jobs);
3. the result goes into the policy's `status.envKnobs` (when it changed, and
   at least daily: its `updated` stamp tells the operator the loop still runs),
   where the operator reads it when it assigns the next job its knobs.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pydantic import ValidationError

from dynamiccl.api.features import StateFeatures
from dynamiccl.api.knob_experiment import (
    MAX_COHORTS,
    EnvKnobExperiment,
    KnobName,
    stamp_unix_s,
)
from dynamiccl.api.tuning_policy import Mode, NCCLTuningPolicySpec
from dynamiccl.operator.cluster_api import ClusterAPI
from dynamiccl.operator.kube import Resource
from dynamiccl.operator.store.experience import ExperienceStore
from dynamiccl.operator.store.features import class_features
from dynamiccl.operator.store.knobs import JobKnobs, assignments, bucket_times, record
from dynamiccl.policy.online import knob_experiment as kx
from dynamiccl.policy.online import knob_scope

log = logging.getLogger("dynamiccl.operator.learning.knob_loop")

_KNOBS: Final = frozenset(k.value for k in KnobName)
REFRESH_S: Final = 24 * 3600.0


def job_knobs(tuning_run: Mapping[str, Any]) -> JobKnobs | None:
    """What a TuningRun says about its job's arm (None: not a tuned job with features)."""
    spec = tuning_run.get("spec") or {}
    uid = (spec.get("jobRef") or {}).get("uid")
    policy = spec.get("policyName")
    if not uid or not policy or spec.get("mode") in (None, Mode.OFF.value):
        return None
    try:
        features = StateFeatures.model_validate(spec.get("features"))
    except ValidationError:
        return None
    env = {e.get("name"): e.get("value") for e in spec.get("envKnobs") or []}
    env |= {e.get("name"): e.get("value") for e in spec.get("userConstraints") or []}
    try:
        arm: kx.Arm = tuple(
            sorted(
                ((KnobName(k), int(str(v))) for k, v in env.items() if k in _KNOBS),
                key=lambda kv: kv[0].value,
            )
        )
    except ValueError:  # a user value that is not an integer: not comparable
        return None
    cohort, description = kx.cohort_of(features)
    return JobKnobs(str(uid), str(policy), cohort, description, kx.arm_key(arm))


def class_skips(
    store: ExperienceStore, cohort: str, spec: NCCLTuningPolicySpec
) -> dict[KnobName, str]:
    """The policy's knobs that cannot matter on a cohort (knob_scope.py), judged on the
    stored features of one of its jobs (the tick's features step stores them before
    this step); none when no job of the cohort has stored features."""
    raw = class_features(store.backend, cohort)
    try:
        features = StateFeatures.model_validate_json(raw) if raw is not None else None
    except ValidationError:
        features = None
    if features is None:
        return {}
    return knob_scope.class_skips((k.name for k in spec.constraints.env_knobs), features.topology)


def experiment_status(
    store: ExperienceStore, policy: str, spec: NCCLTuningPolicySpec, now: float
) -> EnvKnobExperiment:
    """The policy's experiment, every cohort with recorded jobs (the busiest first)."""
    jobs = assignments(store, policy)
    by_cohort: dict[str, list[JobKnobs]] = defaultdict(list)
    for j in jobs:
        by_cohort[j.cohort].append(j)
    times = bucket_times(store, policy)
    cohorts = sorted(by_cohort, key=lambda c: (-len(by_cohort[c]), c))[:MAX_COHORTS]
    entries = []
    for cohort in cohorts:
        skipped = class_skips(store, cohort, spec)
        candidates = kx.arms(spec.constraints.env_knobs, skipped)
        members = {j.job_uid: j.arm for j in by_cohort[cohort]}
        rows = [t for t in times if t.job_uid in members]
        results = kx.evaluate(candidates, members, rows)
        description = by_cohort[cohort][0].cohort_description
        entries.append(kx.experiment(cohort, description, candidates, results, skipped))
    stamp = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return EnvKnobExperiment(updated=stamp, cohorts=entries)


def _due(updated: object, now: float) -> bool:
    """An unchanged status is still rewritten daily: the operator takes an experiment
    whose stamp is older than knob_experiment.STALE_AFTER_S for an abandoned one."""
    stamp = stamp_unix_s(updated)
    return stamp is None or now - stamp >= REFRESH_S


def step(
    store: ExperienceStore,
    api: ClusterAPI,
    policies_res: Resource,
    *,
    policies: Iterable[Mapping[str, Any]],
    runs: Iterable[Mapping[str, Any]],
    now: float,
) -> int:
    """One pass over the listed policies and the TuningRuns seen; policy statuses patched."""
    recorded = [j for tr in runs if (j := job_knobs(tr)) is not None]
    if new := record(store, recorded, now=now):
        log.info("recorded the knob arm of %d new job(s)", new)
    patched = 0
    for obj in policies:
        name = obj["metadata"]["name"]
        try:
            spec = NCCLTuningPolicySpec.model_validate(obj.get("spec") or {})
        except ValidationError:
            continue  # the operator reports invalid policies
        if spec.mode is not Mode.LEARNED or not spec.constraints.env_knobs:
            continue
        status = experiment_status(store, name, spec, now)
        current = (obj.get("status") or {}).get("envKnobs") or {}
        fresh = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        if current.get("cohorts") == fresh["cohorts"] and not _due(current.get("updated"), now):
            continue
        api.patch(policies_res, name, {"status": {"envKnobs": fresh}}, status=True)
        patched += 1
    return patched
