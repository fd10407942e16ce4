"""One step of the model rollout: start a canary, promote it, or roll it back.

An inconclusive canary (the judge still waits after `min_jobs_rollback` of its
jobs, and its jobs are not ahead by the margin either) makes way for a newer
candidate when one was registered meanwhile: the
newer one learned from more experience, and a canary no different from the
promoted model would otherwise hold the rollout forever.

The operator calls `advance_rollout` periodically (a kopf timer on the
NCCLTuningPolicy). Decisions are `promotion.judge`'s, on outcomes measured
since the canary started; every status change is a compare-and-swap in the
registry, so when two operator replicas run the same step at once exactly one
of them changes the status and the other reports `Action.NONE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dynamiccl.api.registry import ModelStatus
from dynamiccl.operator.learning.promotion import Criteria, Judgement, Verdict, judge
from dynamiccl.operator.learning.within_job import paired_jobs
from dynamiccl.operator.store.arms import arm_jobs
from dynamiccl.operator.store.evidence import cell_outcomes
from dynamiccl.operator.store.experience import ExperienceStore
from dynamiccl.operator.store.registry import ModelRegistry, RegistryError


class Action(StrEnum):
    """What a step did."""

    NONE = "none"
    CANARY_STARTED = "canary_started"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class RolloutStep:
    """The outcome of one `advance_rollout` call (for Events and the policy status)."""

    action: Action
    version: str | None
    reason: str
    judgement: Judgement | None = None


def advance_rollout(
    registry: ModelRegistry,
    store: ExperienceStore,
    *,
    canary_percent: int,
    criteria: Criteria | None = None,
) -> RolloutStep:
    """Move the rollout one step forward (see the module docstring)."""
    canary = registry.current(ModelStatus.CANARY)
    if canary is None:
        candidates = registry.list(ModelStatus.CANDIDATE)
        if not candidates:
            return RolloutStep(Action.NONE, None, "no candidate model")
        if canary_percent <= 0:
            return RolloutStep(
                Action.NONE, candidates[-1].version, "canaryPercent is 0: candidates wait"
            )
        newest = candidates[-1]
        try:
            registry.transition(newest.version, ModelStatus.CANARY, expected=ModelStatus.CANDIDATE)
        except RegistryError as exc:
            return RolloutStep(Action.NONE, newest.version, str(exc))
        return RolloutStep(
            Action.CANARY_STARTED, newest.version, f"canary for {canary_percent}% of new jobs"
        )
    promoted = registry.current(ModelStatus.PROMOTED)
    versions = [canary.version] + ([promoted.version] if promoted else [])
    since = canary.status_changed_unix_s
    outcomes = store.job_outcomes(versions, since_unix_s=since)
    j = judge(
        outcomes,
        canary=canary.version,
        baseline=promoted.version if promoted else None,
        criteria=criteria or Criteria(),
        cells=cell_outcomes(store.backend, versions, since) if promoted else (),
        within=(
            paired_jobs(arm_jobs(store.backend, canary.version, promoted.version, since))
            if promoted
            else ()
        ),
    )
    try:
        if j.verdict is Verdict.PROMOTE:
            registry.promote(canary.version, expected=ModelStatus.CANARY)
            return RolloutStep(Action.PROMOTED, canary.version, j.reason, j)
        if j.verdict is Verdict.ROLLBACK:
            registry.transition(
                canary.version, ModelStatus.ROLLED_BACK, expected=ModelStatus.CANARY
            )
            return RolloutStep(Action.ROLLED_BACK, canary.version, j.reason, j)
    except RegistryError as exc:
        return RolloutStep(Action.NONE, canary.version, str(exc), j)
    newer = registry.list(ModelStatus.CANDIDATE)
    c = criteria or Criteria()
    if newer and j.canary_jobs >= c.min_jobs_rollback and not _ahead(j, c):
        return _supersede(registry, canary.version, newer[-1].version, j)
    return RolloutStep(Action.NONE, canary.version, j.reason, j)


def _ahead(j: Judgement, c: Criteria) -> bool:
    """The canary's point estimate beats the baseline by the margin (the bound may still lag)."""
    if j.paired_gain is not None:
        return j.paired_gain > 1 + c.margin
    if j.canary_speedup is None:
        return False
    return j.canary_speedup > (j.baseline_speedup or 1.0) * (1 + c.margin)


def _supersede(registry: ModelRegistry, old: str, new: str, j: Judgement) -> RolloutStep:
    """An inconclusive canary makes way for a newer candidate (trained on more experience)."""
    try:
        registry.transition(old, ModelStatus.ROLLED_BACK, expected=ModelStatus.CANARY)
        registry.transition(new, ModelStatus.CANARY, expected=ModelStatus.CANDIDATE)
    except RegistryError as exc:
        return RolloutStep(Action.NONE, old, str(exc), j)
    return RolloutStep(
        Action.CANARY_STARTED, new, f"canary {old} inconclusive ({j.reason}): superseded", j
    )
