"""The learning loop's Lease under the chart's RBAC, on a REAL apiserver (issue 33 item 3;
docs/security.md, 'Attacks tried', row 19).

With ``ingest.replicas: 2`` the ingest replicas elect the one running the learning loop
with the Lease ``<release>-learning`` in the release namespace. The chart's Role
``<release>-ingest`` lets the ingest create Leases and get and patch only that one; nothing
else of the chart may touch it. Control: the product's own `LeaderElector`, with the
ingest's real token, creates and renews the Lease. Attacks, each with a real token and
refused by RBAC (403): a training pod (its job's sidecar Role bound, pod-bound token, in its
own namespace and in the release namespace) reads, patches, replaces, deletes or
re-creates the Lease to take the loop over; the ingest replaces or deletes it, or patches a
Lease of another name. Needs the local control plane (`make integration`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from dynamiccl.operator.controller import configmap, sidecar_access
from dynamiccl.operator.kube import Kube
from dynamiccl.operator.learning.leader import LeaderElector
from tests.integration.operator.chart_cluster import Release, install, status_of
from tests.integration.operator.test_trust_boundaries_kube import pod_on, pytorchjob

REPLICAS = ("ingest.replicas=2", "store.urlSecret=store-url")
RWX = ("store.persistence.accessMode=ReadWriteMany",)


@pytest.fixture(scope="module")
def rel(cluster_kubeconfig: Path, admin_api: k8s.ApiClient) -> Iterator[Release]:
    r = install(admin_api, cluster_kubeconfig, uuid.uuid4().hex[:6], (*REPLICAS, *RWX))
    yield r
    r.teardown()


def _kubeconfig(rel: Release, token: str, path: Path) -> Path:
    """A kubeconfig for the apiserver the admin client talks to, as ``token``."""
    cfg = rel.api.configuration
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": cfg.host, "certificate-authority": cfg.ssl_ca_cert}}
        ],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def lease(rel: Release, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Lease as the ingest's leader election writes it, with the ingest's token."""
    name = f"{rel.name}-learning"
    path = _kubeconfig(rel, rel.token(f"{rel.name}-ingest"), tmp_path_factory.mktemp("k") / "c")
    default = k8s_config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    try:
        elector = LeaderElector(Kube(str(path)), rel.namespace, name, "ingest-0", duration_s=30)
        assert elector.step(), "the ingest could not take its own Lease"
        assert elector.step(), "the ingest could not renew its own Lease"
    finally:
        k8s_config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION = default
    return name


def _attempts(api: k8s.ApiClient, ns: str, name: str) -> dict[str, int]:
    """Every way to take over the Lease `ns/name`: HTTP status of each."""
    coord: Any = k8s.CoordinationV1Api(api)
    take = {"spec": {"holderIdentity": "attacker", "leaseDurationSeconds": 3600}}
    whole = {"metadata": {"name": name}, **take}
    return {
        "get": status_of(lambda: coord.read_namespaced_lease(name, ns)),
        "patch": status_of(lambda: coord.patch_namespaced_lease(name, ns, take)),
        "update": status_of(lambda: coord.replace_namespaced_lease(name, ns, whole)),
        "delete": status_of(lambda: coord.delete_namespaced_lease(name, ns)),
        "create": status_of(lambda: coord.create_namespaced_lease(ns, whole)),
    }


def _training_pod_token(rel: Release, ns: str, job: str) -> str:
    """A pod-bound token of job's training pod (`default` account), the job's sidecar Role
    bound as the operator binds it."""
    ref = configmap.JobRef("kubeflow.org/v1", "PyTorchJob", job, ns, f"uid-{job}")
    obj = pytorchjob(job)
    access = sidecar_access.build(ref, sidecar_access.service_accounts(obj))
    rbac: Any = k8s.RbacAuthorizationV1Api(rel.api)
    for o in (access.role, access.role_binding):
        o["metadata"].pop("ownerReferences")  # no such job: the GC would delete them
    rbac.create_namespaced_role(ns, access.role)
    rbac.create_namespaced_role_binding(ns, access.role_binding)
    return rel.token("default", ns, pod_on(rel, "default", None, f"{job}-worker-0", ns))


def test_a_training_pod_cannot_take_the_learning_loop_over(rel: Release, lease: str) -> None:
    ns = f"{rel.namespace}-jobs"
    core: Any = k8s.CoreV1Api(rel.api)
    core.create_namespace({"metadata": {"name": ns}})
    rel.cleanups.append(lambda: core.delete_namespace(ns))
    tokens = {
        "own namespace": _training_pod_token(rel, ns, "a"),
        "release namespace": _training_pod_token(rel, rel.namespace, "b"),
    }
    for where, token in tokens.items():
        got = _attempts(rel.as_token(token), rel.namespace, lease)
        assert got == dict.fromkeys(got, 403), f"training pod in its {where}: {got}"
    holder = k8s.CoordinationV1Api(rel.api).read_namespaced_lease(lease, rel.namespace)
    assert holder.spec is not None
    assert holder.spec.holder_identity == "ingest-0"


def test_the_ingest_renews_its_lease_and_nothing_else(rel: Release, lease: str) -> None:
    ingest = rel.as_token(rel.token(f"{rel.name}-ingest"))
    got = _attempts(ingest, rel.namespace, lease)
    assert (got["get"], got["update"], got["delete"]) == (200, 403, 403), got
    other = f"{rel.name}-other"
    admin: Any = k8s.CoordinationV1Api(rel.api)
    admin.create_namespaced_lease(
        rel.namespace, {"metadata": {"name": other}, "spec": {"holderIdentity": "x"}}
    )
    got = _attempts(ingest, rel.namespace, other)
    assert (got["get"], got["patch"], got["update"], got["delete"]) == (403,) * 4, got
    coord: Any = k8s.CoordinationV1Api(ingest)
    assert status_of(lambda: coord.read_namespaced_lease(lease, "kube-system")) == 403
