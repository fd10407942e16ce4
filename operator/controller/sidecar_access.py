"""What a tuned job's sidecars may touch in the API server, and nothing more.

The sidecars of one job agree on in-run table changes through three ConfigMaps
(`dynamiccl.api.coordination`). They reach the API server with their pod's own
service account, which normally has no rights at all. When the operator first
tunes a job it writes, all owned by the job (garbage-collected with it):

- the three coordination ConfigMaps, empty, so the sidecar never needs ``create``
  (which RBAC cannot restrict to names);
- a Role allowing ``get``, ``update`` and ``patch`` on exactly those three names;
- a RoleBinding of that Role to the service accounts of the job's training pods
  (from the pod templates; ``default`` when a template names none). A TrainJob's
  pods come from its training runtime, which the job object does not show: there the
  binding names the namespace's service-account group instead (still only these three
  objects of this one job).

Pure builders; the handler writes what they return.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dynamiccl.api import coordination
from dynamiccl.operator.controller import configmap, jobkinds

RBAC_GROUP: Final = "rbac.authorization.k8s.io"
VERBS: Final = ("get", "patch", "update")


@dataclass(frozen=True)
class SidecarAccess:
    """Objects to create for one tuned job."""

    config_maps: tuple[dict[str, Any], ...]
    role: dict[str, Any]
    role_binding: dict[str, Any]


def access_name(job_name: str) -> str:
    """Name of the job's Role and RoleBinding."""
    return coordination.object_name(job_name, "sidecar")


def service_accounts(job: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Service accounts of the job's training pods; None when the job object cannot say."""
    try:
        groups = jobkinds.replica_groups(job)
    except jobkinds.JobShapeError:
        return None
    names: set[str] = set()
    for group in groups:
        if group.template is None:
            return None
        if not group.trains:
            continue
        spec = group.template.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        sa = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        names.add(str(sa))
    return tuple(sorted(names)) or None


def _subjects(namespace: str, accounts: tuple[str, ...] | None) -> list[dict[str, str]]:
    if accounts is None:
        return [
            {"kind": "Group", "apiGroup": RBAC_GROUP, "name": f"system:serviceaccounts:{namespace}"}
        ]
    return [{"kind": "ServiceAccount", "name": sa, "namespace": namespace} for sa in accounts]


def build(job: configmap.JobRef, accounts: tuple[str, ...] | None) -> SidecarAccess:
    """The coordination ConfigMaps, the Role and the RoleBinding of one job."""
    names = coordination.coordination_names(job.name)
    components = ("epoch-record", "leader-lease", "decision-tables")

    def meta(name: str, component: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": job.namespace,
            "labels": configmap.labels(job, component),
            "ownerReferences": [job.owner_reference()],
        }

    cms = tuple(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(n, comp)}
        for n, comp in zip(names, components, strict=True)
    )
    name = access_name(job.name)
    role = {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "Role",
        "metadata": meta(name, "sidecar-access"),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": list(names),
                "verbs": list(VERBS),
            }
        ],
    }
    binding = {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "RoleBinding",
        "metadata": meta(name, "sidecar-access"),
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": name},
        "subjects": _subjects(job.namespace, accounts),
    }
    return SidecarAccess(config_maps=cms, role=role, role_binding=binding)
