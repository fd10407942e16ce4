"""The TuningRun object of a job: what was decided (spec) and why (status conditions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dynamiccl.api.crds import TUNING_RUN
from dynamiccl.api.features import StateFeatures
from dynamiccl.api.k8s import Condition, ConditionStatus, ObjectRef, dump, set_condition
from dynamiccl.api.tuning_policy import Mode
from dynamiccl.api.tuning_run import (
    COND_ANNOTATIONS_VALID,
    COND_POLICY_MATCHED,
    COND_SCHEDULED,
    COND_TUNED,
    MAX_ARMS,
    Arm,
    EnvSetting,
    Phase,
    TuningRunSpec,
    TuningRunStatus,
)
from dynamiccl.operator.controller.configmap import JobRef, labels, object_name


@dataclass(frozen=True)
class Decision:
    """Everything the operator decided for one job (pure data, from the handler's inputs)."""

    job: JobRef
    tuned: bool
    reason: str  # CamelCase reason of the Tuned condition
    message: str
    mode: Mode = Mode.OFF
    policy_name: str = ""
    policy_message: str = ""
    model_version: str | None = None
    canary: bool = False
    features: StateFeatures | None = None
    table_digest: str = ""
    env_knobs: Mapping[str, str] | None = None
    user_constraints: Mapping[str, str] | None = None
    annotation_errors: Sequence[str] = ()
    generation: int = 0
    measured_cells: Sequence[str] = ()  # cells from the class's findings (job_table)
    arms_baseline: str = ""  # a canary job: the promoted version its table explores too
    arms: Sequence[Arm] = ()  # ... in these cells (job_table.compile_job)


def now() -> str:
    """RFC 3339 UTC timestamp, second precision (as metav1.Time)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build(decision: Decision) -> dict[str, Any]:
    """The TuningRun object (without status: that goes through the status subresource)."""
    d = decision
    spec = TuningRunSpec(
        job_ref=ObjectRef(
            api_version=d.job.api_version, kind=d.job.kind, name=d.job.name, uid=d.job.uid
        ),
        policy_name=d.policy_name,
        mode=d.mode if d.tuned else Mode.OFF,
        model_version=d.model_version,
        canary=d.canary,
        features=d.features,
        table_digest=d.table_digest,
        config_map_name=object_name(d.job.name) if d.tuned else "",
        env_knobs=[EnvSetting(name=k, value=v) for k, v in sorted((d.env_knobs or {}).items())],
        user_constraints=[
            EnvSetting(name=k, value=v[:1024])
            for k, v in sorted((d.user_constraints or {}).items())
        ],
        measured_cells=[m[:256] for m in d.measured_cells[:64]],
        arms_baseline=d.arms_baseline or None,
        arms=list(d.arms[:MAX_ARMS]),
    )
    return {
        "apiVersion": TUNING_RUN.api_version,
        "kind": TUNING_RUN.kind,
        "metadata": {
            "name": object_name(d.job.name),
            "namespace": d.job.namespace,
            "labels": labels(d.job, "tuning-run"),
            "ownerReferences": [d.job.owner_reference()],
        },
        "spec": dump(spec),
    }


def _cond(kind: str, ok: bool, reason: str, message: str, *, gen: int, at: str) -> Condition:
    return Condition(
        type=kind,
        status=ConditionStatus.TRUE if ok else ConditionStatus.FALSE,
        reason=reason,
        message=message[:32768],
        last_transition_time=at,
        observed_generation=gen,
    )


def status(
    decision: Decision, current: Mapping[str, Any] | None = None, at: str | None = None
) -> dict[str, Any]:
    """The status the operator owns: phase and conditions, merged into the current status.

    Fields written by the sidecars (exploration, reward, guardrail events) are kept.
    """
    d = decision
    at = at or now()
    base = TuningRunStatus.model_validate(current or {})
    conds = list(base.conditions)
    errors = "; ".join(d.annotation_errors)
    conds = set_condition(
        conds,
        _cond(
            COND_ANNOTATIONS_VALID,
            not d.annotation_errors,
            "Invalid" if d.annotation_errors else "Valid",
            errors or "all dynamiccl.io annotations parsed",
            gen=d.generation,
            at=at,
        ),
    )
    conds = set_condition(
        conds,
        _cond(
            COND_POLICY_MATCHED,
            bool(d.policy_name),
            "Matched" if d.policy_name else "NoPolicy",
            d.policy_message or ("no policy considered" if not d.policy_name else d.policy_name),
            gen=d.generation,
            at=at,
        ),
    )
    scheduled = bool(d.features and d.features.scheduled)
    conds = set_condition(
        conds,
        _cond(
            COND_SCHEDULED,
            scheduled,
            "PodsBound" if scheduled else "PodsPending",
            "topology observed from the nodes the pods run on"
            if scheduled
            else "topology estimated from the job's shape until its pods are scheduled",
            gen=d.generation,
            at=at,
        ),
    )
    conds = set_condition(
        conds, _cond(COND_TUNED, d.tuned, d.reason, d.message, gen=d.generation, at=at)
    )
    if not d.tuned:
        phase = Phase.UNTUNED
    elif base.phase in (Phase.TUNING, Phase.CONVERGED):
        phase = base.phase
    else:
        phase = Phase.TUNING if scheduled else Phase.PENDING
    out = base.model_copy(
        update={"phase": phase, "conditions": conds, "observed_generation": d.generation}
    )
    return dump(out)
