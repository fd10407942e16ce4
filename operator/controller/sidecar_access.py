"""What a tuned job's sidecars may touch in the API server, and nothing more.

The sidecars of one job agree on in-run table changes through three ConfigMaps
(`dynamiccl.api.sidecar_objects`). They reach the API server with their pod's own
service account, which normally has no rights at all. When the operator first
tunes a job it writes, all owned by the job (garbage-collected with it):

- the coordination ConfigMaps, empty, so the sidecar never needs ``create``
  (which RBAC cannot restrict to names): the three of every job and its ballot
  objects (``<job>-dynamiccl-votes-<g>``, `sidecar_objects.vote_groups` of its pods);
- a Role allowing ``get``, ``update`` and ``patch`` on exactly those names;
- a RoleBinding of that Role to the service accounts of the job's training pods
  (from the pod templates; ``default`` when a template names none). A TrainJob's
  pods come from its training runtime, which the job object does not show: there the
  binding names the namespace's service-account group instead (still only these three
  objects of this one job).

The Role cannot tell two jobs' pods apart when they share a ServiceAccount (often
``default``). So each ConfigMap also carries ``dynamiccl.io/writer-pods``: a pattern
(RE2) of the names the job's training pods get from their controller
(``writer_pods``); the chart's ValidatingAdmissionPolicy ``<release>-coordination``
lets a write through only when the writer's pod-bound token names a pod matching it.

Pure builders; the handler writes what they return.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dynamiccl.api import sidecar_objects
from dynamiccl.api.tuning_policy import JobKind
from dynamiccl.operator.controller import configmap, jobkinds

RBAC_GROUP: Final = "rbac.authorization.k8s.io"
VERBS: Final = ("get", "patch", "update")
WRITER_PODS_ANNOTATION: Final = "dynamiccl.io/writer-pods"
# A Job controller's pod of an indexed Job: <job>-<completion index>-<5 random characters>.
_INDEXED_POD: Final = "[0-9]+-[0-9]+-[a-z0-9]{5}"


@dataclass(frozen=True)
class SidecarAccess:
    """Objects to create for one tuned job."""

    config_maps: tuple[dict[str, Any], ...]
    role: dict[str, Any]
    role_binding: dict[str, Any]


def access_name(job_name: str) -> str:
    """Name of the job's Role and RoleBinding."""
    return sidecar_objects.object_name(job_name, "sidecar")


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


def _re(name: str) -> str:
    """An object name as an RE2 literal (DNS names: only '.' is special)."""
    return name.replace(".", "\\.")


def writer_pods(job: Mapping[str, Any]) -> str:
    """RE2 pattern of the names of a job's training pods, as their controllers name them.

    PyTorchJob (training operator): ``<job>-<role>-<i>``; MPIJob workers: ``<job>-worker-<i>``
    (the launcher does not train); JobSet: ``<jobset>-<replicatedJob>-<j>-<i>-<rand>``;
    TrainJob: its JobSet's pods, of replicated jobs named without a hyphen (Kubeflow
    Trainer's training runtimes name them ``node`` and ``launcher``): with one allowed,
    ``<name>-foo-node-0-0-x`` (TrainJob ``<name>-foo``'s pod) would match TrainJob ``<name>``
    too. The pods of a runtime's hyphenated replicated job cannot coordinate: their job keeps
    the table it started with.
    """
    name = _re(str((job.get("metadata") or {}).get("name", "")))
    try:
        groups = [g for g in jobkinds.replica_groups(job) if g.trains]
    except jobkinds.JobShapeError:
        groups = []
    kind = jobkinds.kind_of(job)
    roles = "|".join(sorted(_re(g.role.lower()) for g in groups)) or "[a-z0-9-]+"
    if kind in (JobKind.PYTORCHJOB, JobKind.MPIJOB):
        return f"^{name}-({roles})-[0-9]+$"
    if kind is JobKind.JOBSET:
        return f"^{name}-({roles})-{_INDEXED_POD}$"
    return f"^{name}-[a-z0-9]+-{_INDEXED_POD}$"  # TrainJob: replicated jobs of its runtime


def _subjects(namespace: str, accounts: tuple[str, ...] | None) -> list[dict[str, str]]:
    if accounts is None:
        return [
            {"kind": "Group", "apiGroup": RBAC_GROUP, "name": f"system:serviceaccounts:{namespace}"}
        ]
    return [{"kind": "ServiceAccount", "name": sa, "namespace": namespace} for sa in accounts]


def pods(job: Mapping[str, Any]) -> int:
    """The job's training pods as its sidecars count them (their ballot objects follow)."""
    try:
        return jobkinds.job_shape(job).replicas
    except jobkinds.JobShapeError:
        return 1


def build(
    job: configmap.JobRef, accounts: tuple[str, ...] | None, writers: str = "", pods: int = 1
) -> SidecarAccess:
    """The coordination ConfigMaps, the Role and the RoleBinding of one job (`writers`:
    `writer_pods` of the job object; empty, no pod may write them; `pods`: its training
    pods, for its ballot objects)."""
    votes = sidecar_objects.votes_names(job.name, pods)
    names = (*sidecar_objects.coordination_names(job.name), *votes)
    components = ("epoch-record", "leader-lease", "decision-tables", *["ballots"] * len(votes))

    def meta(name: str, component: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": job.namespace,
            "labels": configmap.labels(job, component),
            "ownerReferences": [job.owner_reference()],
        }

    cms = tuple(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta(n, comp) | {"annotations": {WRITER_PODS_ANNOTATION: writers}},
        }
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
