"""The NCCLTuningPolicy status the operator owns: observedGeneration, matchedJobs, Valid.

The CRD promised these three (`kubectl get ntp` prints `.status.matchedJobs` as Jobs; the
admin guide lists them) but nothing wrote them. The operator now does, every
`INTERVAL_S` while it runs (operator/run.py), from its policy cache and the
TuningRuns it created:

- ``observedGeneration``: the policy's ``metadata.generation`` the status describes;
- ``matchedJobs``: TuningRuns whose ``spec.policyName`` is this policy (one per job the
  policy was chosen for; a TuningRun is owned by its job, so it goes with the job);
- condition ``Valid``: True (``Accepted``) when the spec parses, False (``InvalidSpec``)
  with the first error otherwise, the same message the reconciler logs when it skips the
  policy (policy_match.parse_policies). Its ``lastTransitionTime`` moves only when its
  status does.

``status.envKnobs`` and ``status.learning`` belong to the learning loop (the ingest);
a JSON merge patch of these keys leaves them alone. A policy is patched only when its
status would change, so a steady cluster costs no writes.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from dynamiccl.api.k8s import ConditionStatus
from dynamiccl.operator.controller.policy_match import parse_policies
from dynamiccl.operator.kube import Patcher, Resource

log = logging.getLogger(__name__)

INTERVAL_S: Final = 30.0
VALID: Final = "Valid"


def matched_jobs(runs: Iterable[Mapping[str, Any]]) -> Counter[str]:
    """TuningRuns per policy name (``spec.policyName``; runs naming none are not counted)."""
    return Counter(
        name for r in runs if (name := str((r.get("spec") or {}).get("policyName") or ""))
    )


def desired(policy: Mapping[str, Any], matched: int, *, at: str) -> dict[str, Any] | None:
    """The status patch for one policy object, or None when its status already says so."""
    meta = policy.get("metadata") or {}
    gen = int(meta.get("generation", 0) or 0)
    _, errors = parse_policies([policy])
    ok = not errors
    message = "spec accepted" if ok else errors[0]
    current = policy.get("status") or {}
    old = next(
        (
            c
            for c in current.get("conditions") or []
            if isinstance(c, Mapping) and c.get("type") == VALID
        ),
        None,
    )
    status = ConditionStatus.TRUE if ok else ConditionStatus.FALSE
    same = old is not None and old.get("status") == status.value
    cond = {
        "type": VALID,
        "status": status.value,
        "reason": "Accepted" if ok else "InvalidSpec",
        "message": message[:32768],
        "lastTransitionTime": str(old.get("lastTransitionTime", "")) if same and old else at,
        "observedGeneration": gen,
    }
    others = [
        c
        for c in current.get("conditions") or []
        if isinstance(c, Mapping) and c.get("type") != VALID
    ]
    want = {"observedGeneration": gen, "matchedJobs": matched, "conditions": [*others, cond]}
    if all(current.get(k) == v for k, v in want.items()):
        return None
    return {"status": want}


def sync(
    kube: Patcher,
    res: Resource,
    policies: Iterable[Mapping[str, Any]],
    runs: Iterable[Mapping[str, Any]],
    *,
    now: datetime | None = None,
) -> int:
    """Patch every policy whose status would change; the number patched. A failed patch
    is logged and the others still go (the next pass retries it)."""
    at = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    counts = matched_jobs(runs)
    patched = 0
    for pol in policies:
        name = str((pol.get("metadata") or {}).get("name", ""))
        if not name:
            continue
        patch = desired(pol, counts.get(name, 0), at=at)
        if patch is None:
            continue
        try:
            kube.patch(res, name, patch, status=True)
        except Exception as exc:  # one policy's failure must not stop the others
            log.warning("status of NCCLTuningPolicy %s: %s: %s", name, type(exc).__name__, exc)
            continue
        patched += 1
    return patched
