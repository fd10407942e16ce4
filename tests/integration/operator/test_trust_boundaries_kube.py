"""Issue 19, items 2, 3 and 4: what the chart's identities can do, on a REAL apiserver.

The chart's ServiceAccounts, RBAC and ValidatingAdmissionPolicies are applied
(tests/integration/operator/chart_cluster.py) and each attempt of the issue is
made with a real token: the node agent's bound to a pod on a kwok node, the
ingest's, and sidecars' bound to pods of two jobs sharing the `default`
ServiceAccount. Writes that must pass are made with dryRun (nothing changes on
the shared cluster); those that must not are refused by RBAC (403) or by a
policy (422).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.api import node_topology as nt
from dynamiccl.operator.controller import configmap, sidecar_access
from dynamiccl.operator.learning.retrain import RetrainSpec, build_retrain_job
from tests.integration.operator.chart_cluster import Release, install, status_of

ROOT = Path(__file__).resolve().parents[3]
DENIED = (403, 422)
DRY = "All"


@pytest.fixture(scope="module")
def rel(cluster_kubeconfig: Path, admin_api: k8s.ApiClient) -> Iterator[Release]:
    ext = k8s.ApiextensionsV1Api(admin_api)
    doc = yaml.safe_load((ROOT / "crds" / "dynamiccl.io_nodetopologies.yaml").read_text())
    try:
        ext.create_custom_resource_definition(doc)
        time.sleep(2)
    except ApiException as exc:
        if exc.status != 409:
            raise
    r = install(admin_api, cluster_kubeconfig, uuid.uuid4().hex[:6])
    yield r
    r.teardown()


def pod_on(rel: Release, sa: str, node: str | None, name: str, ns: str | None = None) -> Any:
    core: Any = k8s.CoreV1Api(rel.api)
    spec: dict[str, Any] = {
        "serviceAccountName": sa,
        "automountServiceAccountToken": False,
        "containers": [{"name": "x", "image": "example.invalid/x:1"}],
        "tolerations": [{"operator": "Exists"}],
    }
    if node:
        spec["nodeName"] = node
    return core.create_namespaced_pod(
        ns or rel.namespace, {"metadata": {"name": name}, "spec": spec}
    )


def two_nodes(rel: Release) -> tuple[str, str]:
    nodes = [str(n.metadata.name) for n in k8s.CoreV1Api(rel.api).list_node().items]  # type: ignore[union-attr]
    assert len(nodes) >= 2
    return nodes[0], nodes[1]


# --- item 2: the node agent writes only its own node -----------------------------------
def test_node_agent_writes_only_its_own_node(rel: Release) -> None:
    mine, other = two_nodes(rel)
    pod = pod_on(rel, f"{rel.name}-node-agent", mine, "agent")
    agent = rel.as_token(rel.token(f"{rel.name}-node-agent", pod=pod))
    core: Any = k8s.CoreV1Api(agent)
    custom: Any = k8s.CustomObjectsApi(agent)

    def label(node: str, key: str) -> int:
        body = {"metadata": {"labels": {key: "x"}}}
        return status_of(lambda: core.patch_node(node, body, dry_run=DRY))

    assert label(mine, c.NODE_LABEL_FABRIC) == 200
    assert label(other, c.NODE_LABEL_FABRIC) in DENIED
    assert label(mine, "node-role.kubernetes.io/control-plane") in DENIED
    taint = {"spec": {"taints": [{"key": "x", "effect": "NoExecute"}]}}
    assert status_of(lambda: core.patch_node(mine, taint, dry_run=DRY)) in DENIED
    assert status_of(lambda: core.patch_node(other, taint, dry_run=DRY)) in DENIED
    cordon = {"spec": {"unschedulable": True}}
    assert status_of(lambda: core.patch_node(mine, cordon, dry_run=DRY)) in DENIED
    assert status_of(lambda: core.delete_node(other, dry_run=DRY)) in DENIED

    def topology(node: str) -> int:
        body = nt.custom_resource(node)  # what the agent creates
        return status_of(
            lambda: custom.create_cluster_custom_object(
                c.GROUP, c.API_VERSION, nt.PLURAL, body, dry_run=DRY
            )
        )

    assert topology(mine) in (200, 409)  # 409: another test's agent published it already
    assert topology(other) in DENIED
    # a token of the same ServiceAccount bound to no pod (so to no node) writes nothing
    loose = k8s.CoreV1Api(rel.as_token(rel.token(f"{rel.name}-node-agent")))
    body = {"metadata": {"labels": {c.NODE_LABEL_FABRIC: "x"}}}
    assert status_of(lambda: loose.patch_node(mine, body, dry_run=DRY)) in DENIED


# --- item 3: the ingest holds only what it uses ----------------------------------------
def retrain_job(rel: Release, **over: Any) -> dict[str, Any]:
    spec = RetrainSpec(
        policy_name="p",
        policy_uid="u",
        namespace=rel.namespace,
        image="ghcr.io/dynamiccl/dynamiccl-train:0.1.0",
        store_url="sqlite:////var/lib/dynamiccl/experience.db",
        new_version="v2",
        parent_version="v1",
        pvc_name=f"{rel.name}-store",
        service_account=f"{rel.name}-train",
    )
    job = build_retrain_job(spec)
    job["spec"]["template"]["spec"].update(over)
    return job


def test_ingest_holds_only_what_it_uses(rel: Release, admin_api: k8s.ApiClient) -> None:
    ingest = rel.as_token(rel.token(f"{rel.name}-ingest"))
    core: Any = k8s.CoreV1Api(ingest)
    rbac: Any = k8s.RbacAuthorizationV1Api(ingest)
    batch: Any = k8s.BatchV1Api(ingest)
    assert status_of(core.list_config_map_for_all_namespaces) == 403
    assert status_of(lambda: core.read_namespaced_config_map("x", "kube-system")) == 403
    assert status_of(core.list_pod_for_all_namespaces) == 403
    assert status_of(lambda: core.list_namespaced_secret(rel.namespace)) == 403
    role = {"metadata": {"name": "r"}, "rules": []}
    assert status_of(lambda: rbac.create_namespaced_role("default", role, dry_run=DRY)) == 403
    own = retrain_job(rel)
    # the chart's train image: what include "dynamiccl.trainImage" renders by default
    adm: Any = k8s.AdmissionregistrationV1Api(admin_api)
    vap = adm.read_validating_admission_policy(f"{rel.name}-ingest-jobs")
    rendered = str(vap.spec.validations[-1].expression)
    own_image = rendered.split('c.image == "')[1].split('"', maxsplit=1)[0]
    own["spec"]["template"]["spec"]["containers"][0]["image"] = own_image
    ns = rel.namespace
    assert status_of(lambda: batch.create_namespaced_job(ns, own, dry_run=DRY)) == 200
    evil = retrain_job(
        rel,
        serviceAccountName=f"{rel.name}-node-agent",
        automountServiceAccountToken=True,
        hostPID=True,
        volumes=[{"name": "root", "hostPath": {"path": "/"}}],
    )
    evil["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
    evil["spec"]["template"]["spec"]["containers"][0]["image"] = own_image
    assert status_of(lambda: batch.create_namespaced_job(ns, evil, dry_run=DRY)) == 422
    other_image = retrain_job(rel)
    other_image["spec"]["template"]["spec"]["containers"][0]["image"] = "evil.example/x:1"
    assert status_of(lambda: batch.create_namespaced_job(ns, other_image, dry_run=DRY)) == 422
    assert status_of(lambda: batch.create_namespaced_job("default", own, dry_run=DRY)) == 403


# --- item 4: a job's coordination ConfigMaps, only its own pods ------------------------
def pytorchjob(name: str) -> dict[str, Any]:
    replica = {"replicas": 1, "template": {"spec": {"containers": [{"name": "pytorch"}]}}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {"pytorchReplicaSpecs": {"Master": replica, "Worker": replica}},
    }


def test_a_pod_of_another_job_under_the_same_account_cannot_write(rel: Release) -> None:
    ns = f"{rel.namespace}-jobs"
    admin: Any = k8s.CoreV1Api(rel.api)
    rbac: Any = k8s.RbacAuthorizationV1Api(rel.api)
    admin.create_namespace(
        {"metadata": {"name": ns, "labels": {"dynamiccl.io/boundary-test": rel.suffix}}}
    )
    rel.cleanups.append(lambda: admin.delete_namespace(ns))
    for job in ("a", "b"):
        ref = configmap.JobRef("kubeflow.org/v1", "PyTorchJob", job, ns, f"uid-{job}")
        obj = pytorchjob(job)
        access = sidecar_access.build(
            ref, sidecar_access.service_accounts(obj), sidecar_access.writer_pods(obj)
        )
        for o in (*access.config_maps, access.role, access.role_binding):
            o["metadata"].pop("ownerReferences")  # no such job: the GC would delete them
        for cm in access.config_maps:
            admin.create_namespaced_config_map(ns, cm)
        rbac.create_namespaced_role(ns, access.role)
        rbac.create_namespaced_role_binding(ns, access.role_binding)
    pods = {job: pod_on(rel, "default", None, f"{job}-worker-0", ns) for job in ("a", "b")}
    time.sleep(1)  # the RoleBindings take effect

    def write(job: str, cm_of: str, patch: dict[str, Any] | None = None) -> int:
        api: Any = k8s.CoreV1Api(rel.as_token(rel.token("default", ns, pods[job])))
        body = patch or {"data": {"record": f"written by {job}"}}
        name = f"{cm_of}-dynamiccl-epochs"
        return status_of(lambda: api.patch_namespaced_config_map(name, ns, body, dry_run=DRY))

    assert write("a", "a") == 200
    assert write("b", "b") == 200
    assert write("b", "a") == 422  # same ServiceAccount, another job's pod
    assert write("a", "b") == 422
    grab = {"metadata": {"annotations": {sidecar_access.WRITER_PODS_ANNOTATION: ".*"}}}
    assert write("a", "a", grab) == 422  # the pattern is the operator's to set
    unlabel = {"metadata": {"labels": {c.LABEL_JOB_KIND: None, c.LABEL_COMPONENT: None}}}
    assert write("b", "a", unlabel) == 422  # the old object's labels select it: no escape
    loose: Any = k8s.CoreV1Api(rel.as_token(rel.token("default", ns)))  # bound to no pod
    body = {"data": {"record": "x"}}
    assert (
        status_of(lambda: loose.patch_namespaced_config_map("a-dynamiccl-epochs", ns, body)) == 422
    )
