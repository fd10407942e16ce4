"""Pure decision for one job: tuned or not (and why), its ConfigMap, TuningRun and Event.

The kopf handlers gather the inputs (job, namespace labels, policies, pods,
nodes) and apply the outcome; everything in between is here, without I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynamiccl import constants as c
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.learning import ClassCoverage
from dynamiccl.api.tuning_policy import Mode
from dynamiccl.api.tuning_run import COND_TUNED
from dynamiccl.operator.controller import annotations as job_annotations
from dynamiccl.operator.controller import configmap, features, jobkinds, topo_files, tuningrun
from dynamiccl.operator.controller.policy_match import (
    Match,
    Policy,
    choose_model,
    live_canary,
    parent_model,
    select,
)
from dynamiccl.operator.controller.topo_files import TopoData
from dynamiccl.policy.online import knob_experiment, knob_scope


@dataclass(frozen=True)
class Inputs:
    """Everything a decision depends on."""

    job: Mapping[str, Any]
    namespace_labels: Mapping[str, str]
    policies: Sequence[Policy]
    policy_errors: Sequence[str] = ()
    pods: Sequence[Mapping[str, Any]] = ()
    nodes: Mapping[str, Mapping[str, Any]] | None = None
    node_topologies: Mapping[str, Mapping[str, Any]] | None = None
    cluster_nodes: Sequence[Mapping[str, Any]] = ()
    ingest_ca: str = ""
    compiler: configmap.Compiler | None = None  # None: the policy package's shipped model
    previous_env: Mapping[str, str] | None = None  # the knobs an earlier decision gave the job
    previous_model: tuple[str, bool] | None = None  # (version, canary) an earlier decision gave
    previous_config: Mapping[str, Any] | None = None  # the job's ConfigMap as it is (its table)
    canary_seen: Mapping[str, int] | None = None  # per canary version, jobs given a model meanwhile
    now_unix_s: float | None = None  # to tell a live env-knob experiment from an abandoned one
    topo_files: Mapping[str, str] = field(default_factory=dict)  # node -> NCCL topology XML
    topo_data: TopoData | None = None  # config_map_data(topo_files), if built already


@dataclass(frozen=True)
class Outcome:
    """What to write for the job."""

    decision: tuningrun.Decision
    config_map: dict[str, Any] | None  # None: the job is not tuned (delete any old one)
    tuning_run: dict[str, Any]
    model_unavailable: bool = False  # its model version could not be had: retry later
    offered_canary: str | None = None  # its model was chosen now, while this canary ran


def job_ref(job: Mapping[str, Any]) -> configmap.JobRef:
    """The job's reference fields."""
    meta = job.get("metadata") or {}
    return configmap.JobRef(
        api_version=str(job.get("apiVersion", "")),
        kind=str(job.get("kind", "")),
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        uid=str(meta.get("uid", "")),
    )


def wants_tuning(job: Mapping[str, Any], namespace_labels: Mapping[str, str]) -> bool:
    """Does the job (or its namespace) ask for tuning — including with a malformed value?"""
    raw = (job.get("metadata") or {}).get("annotations") or {}
    parsed = job_annotations.parse(raw)
    if job_annotations.opted_in(parsed, namespace_labels):
        return True
    return any(e.key == c.ANNOTATION_TUNE for e in parsed.errors)


def _user_constraints(job: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        groups = jobkinds.replica_groups(job)
    except jobkinds.JobShapeError:
        return out
    for g in groups:
        if g.template is not None and g.trains:
            out.update(jobkinds.user_constraints(g.template.get("spec") or {}))
    return out


def decide(inp: Inputs) -> Outcome | None:
    """The outcome for a job, or None when the job does not ask to be tuned."""
    job = inp.job
    if not wants_tuning(job, inp.namespace_labels):
        return None
    meta = job.get("metadata") or {}
    parsed = job_annotations.parse(meta.get("annotations") or {})
    base = tuningrun.Decision(
        job=job_ref(job),
        tuned=False,
        reason="",
        message="",
        generation=int(meta.get("generation") or 0),
    )
    if parsed.errors:
        errs = [str(e) for e in parsed.errors]
        return _untuned(
            base,
            "InvalidAnnotations",
            "job runs untuned: malformed annotations: " + "; ".join(errs),
            annotation_errors=errs,
        )
    kind = jobkinds.kind_of(job)
    if kind is None:  # pragma: no cover - handlers only pass watched kinds
        return _untuned(base, "UnsupportedKind", f"{base.job.kind} is not a watched job kind")
    match = select(
        inp.policies,
        kind=kind,
        job_labels=meta.get("labels") or {},
        namespace_labels=inp.namespace_labels,
        requested=parsed.policy,
    )
    if match.policy is None or match.policy.spec.mode is Mode.OFF:
        return _without_policy(base, match, inp.policy_errors)
    at = {"policy_name": match.policy.name, "policy_message": match.reason}
    try:
        built = features.build(
            job,
            parsed,
            pods=inp.pods,
            nodes=inp.nodes,
            node_topologies=inp.node_topologies,
            cluster_nodes=inp.cluster_nodes,
        )
    except features.FeatureError as exc:
        return _untuned(base, "InvalidJob", f"job runs untuned: {exc}", **at)
    return _tuned(inp, base, match, match.policy, built.features)


def _untuned(base: tuningrun.Decision, reason: str, message: str, **kw: Any) -> Outcome:
    d = _replace(base, reason=reason, message=message, **kw)
    return Outcome(d, None, tuningrun.build(d))


def _without_policy(
    base: tuningrun.Decision, match: Match, policy_errors: Sequence[str]
) -> Outcome:
    """Untuned: no policy selects the job, or the one that does is off."""
    if match.policy is None:
        extra = f" (ignored invalid policies: {'; '.join(policy_errors)})" if policy_errors else ""
        return _untuned(
            base,
            "NoPolicy",
            f"job runs untuned: {match.reason}{extra}",
            policy_message=match.reason,
        )
    return _untuned(
        base,
        "PolicyModeOff",
        f"job runs untuned: NCCLTuningPolicy {match.policy.name!r} has mode off",
        policy_name=match.policy.name,
        policy_message=match.reason,
    )


def _tuned(
    inp: Inputs, base: tuningrun.Decision, match: Match, policy: Policy, feats: StateFeatures
) -> Outcome:
    """The job's ConfigMap (table, features, env knobs) and its TuningRun."""
    ref = base.job
    offered = None if inp.previous_model else live_canary(policy.spec.model, policy.learning)
    model, canary = inp.previous_model or choose_model(
        policy.spec.model, ref.uid, policy.learning, inp.canary_seen
    )
    constraints = _user_constraints(inp.job)
    knobs = _knobs(policy, feats, ref.uid, inp.previous_env, inp.now_unix_s)
    coverage = _coverage(inp.policies, policy, feats)
    key = configmap.compile_key(feats, policy.name, policy.spec, model)
    kept = (
        configmap.kept_table(inp.previous_config, ref.uid, key)
        if inp.previous_config is not None
        else None
    )
    if kept is None:  # compiled afresh: the class's evidence as it is now
        kept = configmap.compile_job(
            feats, policy.spec, model, inp.compiler, coverage=coverage, job_uid=ref.uid,
            baseline_version=parent_model(policy.spec.model, policy.learning) if canary else None,
        )  # fmt: skip
    table, measured = kept.table, kept.measured
    cm = configmap.build(
        ref,
        feats,
        policy.name,
        policy.spec,
        model_version=model,
        canary=canary,
        user_constraints=constraints,
        ingest_ca=inp.ingest_ca,
        env=knobs.env,
        topo_data=(
            topo_files.config_map_data(inp.topo_files) if inp.topo_data is None else inp.topo_data
        ),
        kept=kept,
    )
    d = _replace(
        base,
        tuned=True,
        reason="Tuned",
        message=(
            f"{match.reason}; mode {policy.spec.mode.value}, model {model}"
            f"{' (canary)' if canary else ''}; {feats.world_size} ranks on "
            f"{feats.topology.nodes} node(s), worst tier {feats.topology.tier_max.value}"
            f"{f'; env knobs: {knobs.reason}' if knobs.env else ''}"
            f"{f'; {len(measured)} cell(s) from measurements' if measured else ''}"
        ),
        mode=policy.spec.mode,
        policy_name=policy.name,
        policy_message=match.reason,
        model_version=model,
        canary=canary,
        features=feats,
        table_digest=configmap.digest(table),
        env_knobs=knobs.env,
        user_constraints=constraints,
        measured_cells=measured,
        arms_baseline=kept.arms_baseline,
        arms=kept.arms,
    )
    return Outcome(d, cm, tuningrun.build(d), configmap.model_unavailable(table), offered)


def _coverage(
    policies: Sequence[Policy], policy: Policy, feats: StateFeatures
) -> ClassCoverage | None:
    """What measurements settled for the job's hardware class (the learning loop publishes it
    on the primary learned policy; the job's own policy first)."""
    hw_class, _ = knob_experiment.cohort_of(feats)
    for p in (policy, *policies):
        found = p.learning.coverage(hw_class) if p.learning is not None else None
        if found is not None:
            return found
    return None


def _knobs(
    policy: Policy,
    feats: StateFeatures,
    job_uid: str,
    previous: Mapping[str, str] | None,
    now: float | None,
) -> knob_experiment.Assignment:
    """The job's env knobs: those it was first given, else the experiment's assignment."""
    if previous is not None:
        arm = ",".join(f"{k}={v}" for k, v in sorted(previous.items()))
        return knob_experiment.Assignment(dict(previous), arm, "kept from the job's first decision")
    cohort, _ = knob_experiment.cohort_of(feats)
    exp = policy.env_knobs
    entry = exp.cohort(cohort) if exp is not None else None
    live = exp is not None and knob_experiment.is_live(exp, now)
    skip = knob_scope.job_skips((k.name for k in policy.spec.constraints.env_knobs), feats)
    return knob_experiment.assign(policy.spec, entry, cohort, job_uid, evaluated=live, skip=skip)


def _replace(d: tuningrun.Decision, **kw: Any) -> tuningrun.Decision:
    fields = {k: getattr(d, k) for k in d.__dataclass_fields__}
    return tuningrun.Decision(**(fields | kw))


def event_needed(outcome: Outcome, current_status: Mapping[str, Any] | None) -> bool:
    """Emit an Event only when the Tuned condition's reason or message changes."""
    for cond in (current_status or {}).get("conditions") or []:
        if cond.get("type") == COND_TUNED:
            return not (
                cond.get("reason") == outcome.decision.reason
                and cond.get("message") == outcome.decision.message
            )
    return True


_EVENT_REASON = {"InvalidAnnotations": "InvalidAnnotations", "InvalidJob": "InvalidJob"}


def event(outcome: Outcome, at: str) -> dict[str, Any]:
    """A core/v1 Event on the job explaining the decision."""
    d = outcome.decision
    suffix = hashlib.sha256(f"{d.job.uid}{d.reason}{d.message}{at}".encode()).hexdigest()[:10]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{d.job.name[:200]}.{suffix}", "namespace": d.job.namespace},
        "involvedObject": {
            "apiVersion": d.job.api_version,
            "kind": d.job.kind,
            "name": d.job.name,
            "namespace": d.job.namespace,
            "uid": d.job.uid,
        },
        "reason": "NCCLTuned"
        if d.tuned
        else ("NCCLTuningSkipped" if d.reason != "InvalidAnnotations" else "InvalidAnnotations"),
        "message": d.message[:1024],
        "type": "Normal" if d.tuned or d.reason in ("NoPolicy", "PolicyModeOff") else "Warning",
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
        "source": {"component": "dynamiccl-operator"},
        "reportingComponent": "dynamiccl.io/operator",
        "reportingInstance": "dynamiccl-operator",
    }
