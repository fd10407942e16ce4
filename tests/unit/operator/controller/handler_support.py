"""The operator's `Reconciler` against the in-memory API server, for the handlers' tests
(test_handlers.py, test_handler_bindings.py).

The API server is `dynamiccl.testing.memory_api.MemoryAPI` holding the namespace `NS`
(no labels) and the policies; `cluster(refuse_rbac=True)` is one whose chart's RBAC was
trimmed (the operator may not create Roles or RoleBindings: 403, as `Kube` reports it).
`reconciler` starts a `Reconciler` whose policy cache and the API server both hold the
observe policy ``all``; `policy_event` is a policy written to the API server and delivered
by the watch (the two then agree again).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dynamiccl.operator.controller.cache import ObjectCache
from dynamiccl.operator.controller.handlers import POLICIES, Reconciler
from dynamiccl.operator.kube import NAMESPACES, ROLES, Resource
from dynamiccl.testing import builders
from dynamiccl.testing.memory_api import MemoryAPI

NS = "team"
PYTORCHJOBS = Resource("kubeflow.org", "v1", "pytorchjobs")
OBSERVE_ALL: dict[str, Any] = {
    "apiVersion": "dynamiccl.io/v1alpha1",
    "kind": "NCCLTuningPolicy",
    "metadata": {"name": "all", "uid": "p"},
    "spec": {"mode": "observe"},
}


class TrimmedRBAC(MemoryAPI):
    """An API server that refuses the operator's RBAC writes (a trimmed chart)."""

    def create(self, res: Resource, body: Mapping[str, Any]) -> dict[str, Any]:
        if res.group == ROLES.group:
            raise RuntimeError(f"{res.plural}/{body['metadata']['name']}: 403 Forbidden")
        return super().create(res, body)


def cluster(*, refuse_rbac: bool = False) -> MemoryAPI:
    """The API server with the tests' namespace, which has no labels."""
    kube = TrimmedRBAC() if refuse_rbac else MemoryAPI()
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    return kube


def pytorchjob() -> dict[str, Any]:
    return builders.pytorchjob(
        "llm",
        namespace=NS,
        uid="u-9",
        annotations={"dynamiccl.io/tune": "true"},
        master=False,
        workers=2,
        pod=builders.template(builders.container(gpus=0, image="x")),
        nproc_per_node=None,
    )


def reconciler(kube: MemoryAPI) -> Reconciler:
    """A reconciler on ``kube``; the observe policy ``all`` on the API server and in its
    policy cache."""
    rec = Reconciler(kube, ObjectCache(), ObjectCache(), ObjectCache(), ObjectCache())  # type: ignore[arg-type]
    policy_event(kube, rec, "ADDED", OBSERVE_ALL)
    return rec


def policy_event(kube: MemoryAPI, rec: Reconciler, kind: str, policy: dict[str, Any]) -> None:
    """``policy`` written to the API server (deleted when ``kind`` is DELETED), then its
    watch event in the reconciler's policy cache."""
    if kind == "DELETED":
        kube.delete(POLICIES, policy["metadata"]["name"])
    else:
        kube.add(POLICIES, copy.deepcopy(policy))
    rec.policies.on_event(kind, policy)


def names(kube: MemoryAPI, res: Resource) -> set[str]:
    """The names of the objects of ``res`` the API server holds in `NS`."""
    return {o["metadata"]["name"] for o in kube.list(res, NS)}
