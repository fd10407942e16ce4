"""Which NCCLTuningPolicies a release's learning loop follows: those that select its jobs.

NCCLTuningPolicies are cluster-scoped, so with two DynamICCL releases in one
cluster (a test release and a demo release) every loop lists both releases'
policies. A loop learns from its own store only, so it follows only the policies
that select the jobs whose rewards its store holds: the job's kind is in
`selector.jobKinds` and its namespace's labels match `selector.namespaceSelector`.
`selector.jobSelector` is not checked (the store keeps no job labels): a policy that
selects some jobs of a namespace counts for that namespace. A loop whose store holds
no job yet follows no policy: it has nothing to learn from, and it never writes
another release's `status`.

The chart has no list of watched namespaces to scope by (the operator's
`--watch-namespace` is unused and incompatible with peering): the store's jobs are
what the release actually serves, since only its own sidecars report to its ingest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from dynamiccl.api.tuning_policy import PolicySelector

JobScope = tuple[str, str]  # (namespace, job kind) of a job whose rewards the store holds


def _selector(policy: Mapping[str, Any]) -> PolicySelector | None:
    """spec.selector; None when malformed (the operator reports such a policy)."""
    try:
        return PolicySelector.model_validate((policy.get("spec") or {}).get("selector") or {})
    except ValidationError:
        return None


def _selects(sel: PolicySelector, kind: str, ns_labels: Mapping[str, str]) -> bool:
    if kind not in {k.value for k in sel.job_kinds}:
        return False
    return sel.namespace_selector is None or sel.namespace_selector.matches(dict(ns_labels))


def in_scope(
    policies: Sequence[Mapping[str, Any]],
    jobs: Iterable[JobScope],
    namespace_labels: Mapping[str, Mapping[str, str]],
) -> list[dict[str, Any]]:
    """The policy objects that select at least one of `jobs` (in their listed order).

    `namespace_labels`: each namespace's labels (a namespace missing from it, e.g.
    deleted since, has none).
    """
    wanted = set(jobs)
    out = []
    for policy in policies:
        sel = _selector(policy)
        if sel is not None and any(
            _selects(sel, kind, namespace_labels.get(ns) or {}) for ns, kind in wanted
        ):
            out.append(dict(policy))
    return out


def labels_by_namespace(namespaces: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """{name: labels} of listed Namespace objects."""
    out: dict[str, dict[str, str]] = {}
    for ns in namespaces:
        meta = ns.get("metadata") or {}
        labels = meta.get("labels") or {}
        out[str(meta.get("name", ""))] = {str(k): str(v) for k, v in labels.items()}
    return out
