"""Select the NCCLTuningPolicy that applies to a job, and the model version it gets.

A policy applies when the job's kind is in ``selector.jobKinds``, its namespace's
labels match ``selector.namespaceSelector`` and its own labels match
``selector.jobSelector`` (omitted selectors match everything). Among the
applicable policies the winner is deterministic: highest ``priority``, then the
most specific selectors (most terms), then the lexically smallest name. A job
annotated ``dynamiccl.io/policy: NAME`` considers only that policy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from dynamiccl.api.knob_experiment import EnvKnobExperiment
from dynamiccl.api.learning import LearningStatus
from dynamiccl.api.tuning_policy import JobKind, ModelRollout, NCCLTuningPolicySpec

DEFAULT_VERSION = "default"  # the shipped model: spec.model.version left at it pins nothing


@dataclass(frozen=True)
class Policy:
    """A parsed NCCLTuningPolicy object."""

    name: str
    spec: NCCLTuningPolicySpec
    generation: int = 0
    env_knobs: EnvKnobExperiment | None = None  # status.envKnobs (the learning loop's)
    learning: LearningStatus | None = None  # status.learning (the learning loop's)

    @property
    def specificity(self) -> int:
        """Selector terms: more terms = more specific."""
        sel = self.spec.selector
        return sum(s.specificity for s in (sel.namespace_selector, sel.job_selector) if s)


@dataclass(frozen=True)
class Match:
    """The outcome of policy selection, with a reason a user can read."""

    policy: Policy | None
    reason: str
    applicable: tuple[str, ...] = ()


def _experiment(obj: Mapping[str, Any]) -> EnvKnobExperiment | None:
    """status.envKnobs; a malformed one counts as none (the next jobs get the defaults)."""
    raw = (obj.get("status") or {}).get("envKnobs")
    if not raw:
        return None
    try:
        return EnvKnobExperiment.model_validate(raw)
    except ValidationError:
        return None


def _learning(obj: Mapping[str, Any]) -> LearningStatus | None:
    """status.learning; a malformed one counts as none (jobs explore as if nothing is known)."""
    raw = (obj.get("status") or {}).get("learning")
    if not raw:
        return None
    try:
        return LearningStatus.model_validate(raw)
    except ValidationError:
        return None


def parse_policies(objects: Iterable[Mapping[str, Any]]) -> tuple[list[Policy], list[str]]:
    """Parse NCCLTuningPolicy objects; invalid ones are skipped with a message each."""
    out: list[Policy] = []
    errors: list[str] = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", "?"))
        try:
            spec = NCCLTuningPolicySpec.model_validate(obj.get("spec") or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "spec"
            errors.append(f"NCCLTuningPolicy {name}: spec.{where}: {first['msg']}")
            continue
        out.append(
            Policy(
                name=name,
                spec=spec,
                generation=int(meta.get("generation", 0) or 0),
                env_knobs=_experiment(obj),
                learning=_learning(obj),
            )
        )
    return out, errors


def applies(
    policy: Policy, kind: JobKind, job_labels: Mapping[str, str], ns_labels: Mapping[str, str]
) -> bool:
    """Does the policy select this job?"""
    sel = policy.spec.selector
    if kind not in sel.job_kinds:
        return False
    if sel.namespace_selector is not None and not sel.namespace_selector.matches(dict(ns_labels)):
        return False
    return sel.job_selector is None or sel.job_selector.matches(dict(job_labels))


def _rank(p: Policy) -> tuple[int, int, str]:
    return (-p.spec.priority, -p.specificity, p.name)


def select(
    policies: Iterable[Policy],
    *,
    kind: JobKind,
    job_labels: Mapping[str, str],
    namespace_labels: Mapping[str, str],
    requested: str | None = None,
) -> Match:
    """The policy for a job (or None with the reason)."""
    pool = list(policies)
    if requested is not None:
        pool = [p for p in pool if p.name == requested]
        if not pool:
            return Match(None, f"the requested NCCLTuningPolicy {requested!r} does not exist")
    hits = sorted((p for p in pool if applies(p, kind, job_labels, namespace_labels)), key=_rank)
    if not hits:
        if requested is not None:
            return Match(None, f"NCCLTuningPolicy {requested!r} does not select this job")
        return Match(None, f"no NCCLTuningPolicy selects this {kind.value} (checked {len(pool)})")
    names = tuple(p.name for p in hits)
    win = hits[0]
    why = f"NCCLTuningPolicy {win.name!r} (priority {win.spec.priority})"
    if len(hits) > 1:
        why += f" won over {', '.join(names[1:])}"
    return Match(win, why, names)


def spread_pick(percent: int, k: int) -> bool:
    """Does the k-th job (1, 2, ...) of a canary's run go to the canary at `percent` %? Exactly
    round(percent * n / 100) of any first n jobs do, evenly spread (20 %: jobs 3, 8, 13, ...)."""
    share = 2 * percent  # in units of 1/200: floor(p*k + 1/2) = (2*p*k + 100) // 200
    return (share * k + 100) // 200 > (share * (k - 1) + 100) // 200


def _arms(rollout: ModelRollout, learning: LearningStatus | None) -> tuple[str, str | None, int]:
    """(parent, canary, canary percent) for a policy's new jobs: the spec's pins win (a pinned
    `model.canaryVersion` with its `canaryPercent`; a pinned `model.version` alone: no canary),
    else the learning loop's rollout (`status.learning.rollout`)."""
    if rollout.canary_version is not None and rollout.canary_percent > 0:
        return rollout.version, rollout.canary_version, rollout.canary_percent
    pinned = rollout.version != DEFAULT_VERSION or rollout.canary_version is not None
    loop = learning.rollout if learning is not None else None
    if loop is None or pinned:
        return rollout.version, None, 0
    return loop.promoted or rollout.version, loop.canary, loop.canary_percent


def choose_model(
    rollout: ModelRollout,
    job_uid: str,
    learning: LearningStatus | None = None,
    seen: Mapping[str, int] | None = None,
) -> tuple[str, bool]:
    """The model version for a job (`_arms`: the parent, and the canary with its share).

    Canary membership: with `seen` (per canary version, how many jobs were given a model
    while it ran: the operator counts them), the canary takes exactly its share of them,
    evenly spread (`spread_pick`), so that its judge has its jobs in the fewest jobs and
    no job uid's luck decides when; without it (the demo's harness, a restarted count's
    first jobs are counted from 0), a stable hash of the job's uid decides.
    """
    parent, canary, percent = _arms(rollout, learning)
    if canary is None or percent <= 0:
        return parent, False
    if seen is not None:
        return (canary, True) if spread_pick(percent, seen.get(canary, 0) + 1) else (parent, False)
    bucket = int.from_bytes(hashlib.sha256(job_uid.encode()).digest()[:4], "big") % 100
    return (canary, True) if bucket < percent else (parent, False)


def parent_model(rollout: ModelRollout, learning: LearningStatus | None) -> str:
    """The version a policy's new jobs get when they are not the canary's (the promoted one)."""
    return _arms(rollout, learning)[0]


def live_canary(rollout: ModelRollout, learning: LearningStatus | None) -> str | None:
    """The canary version new jobs of a policy may get now (None: none)."""
    _, canary, percent = _arms(rollout, learning)
    return canary if percent > 0 else None
