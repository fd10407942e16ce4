"""Issues 19 (items 2, 3, 4) and 32 (A, C): what the chart's identities can do, on a REAL
apiserver.

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
from dataclasses import dataclass
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
from dynamiccl.testing import builders
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
    """A Master and a Worker, containers a name alone: never created, read by sidecar_access."""
    return builders.pytorchjob(
        name, pod=builders.template({"name": "pytorch"}), nproc_per_node=None
    )


@dataclass
class TwoJobs:
    """Jobs a, b and c (PyTorchJobs, coordination objects as the operator writes them, with
    its token) in one namespace, a pod `<job>-worker-0` of each under the shared `default`
    ServiceAccount."""

    rel: Release
    ns: str
    pods: dict[str, Any]

    def api(self, job: str | None) -> Any:
        """A client with the pod-bound token of job's pod (None: a token bound to no pod)."""
        pod = self.pods[job] if job else None
        return k8s.CoreV1Api(self.rel.as_token(self.rel.token("default", self.ns, pod)))

    def write(self, job: str | None, cm_of: str, patch: dict[str, Any] | None = None) -> int:
        body = patch or {"data": {"record": f"written by {job}"}}
        name = f"{cm_of}-dynamiccl-epochs"
        api = self.api(job)
        return status_of(lambda: api.patch_namespaced_config_map(name, self.ns, body, dry_run=DRY))


@pytest.fixture(scope="module")
def two_jobs(rel: Release) -> TwoJobs:
    ns = f"{rel.namespace}-jobs"
    admin: Any = k8s.CoreV1Api(rel.api)
    rbac: Any = k8s.RbacAuthorizationV1Api(rel.api)
    admin.create_namespace(
        {"metadata": {"name": ns, "labels": {"dynamiccl.io/boundary-test": rel.suffix}}}
    )
    rel.cleanups.append(lambda: admin.delete_namespace(ns))
    operator: Any = k8s.CoreV1Api(rel.as_token(rel.token(f"{rel.name}-operator")))
    for job in ("a", "b", "c"):
        ref = configmap.JobRef("kubeflow.org/v1", "PyTorchJob", job, ns, f"uid-{job}")
        obj = pytorchjob(job)
        access = sidecar_access.build(
            ref,
            sidecar_access.service_accounts(obj),
            sidecar_access.writer_pods(obj),
            sidecar_access.pods(obj),
        )
        for o in (*access.config_maps, access.role, access.role_binding):
            o["metadata"].pop("ownerReferences")  # no such job: the GC would delete them
        for cm in access.config_maps:  # the operator's to create (policy -coordination)
            operator.create_namespaced_config_map(ns, cm)
        rbac.create_namespaced_role(ns, access.role)
        rbac.create_namespaced_role_binding(ns, access.role_binding)
    pods = {job: pod_on(rel, "default", None, f"{job}-worker-0", ns) for job in ("a", "b", "c")}
    time.sleep(1)  # the RoleBindings take effect
    return TwoJobs(rel, ns, pods)


def test_a_pod_of_another_job_under_the_same_account_cannot_write(two_jobs: TwoJobs) -> None:
    write = two_jobs.write
    assert write("a", "a") == 200
    assert write("b", "b") == 200
    assert write("b", "a") == 422  # same ServiceAccount, another job's pod
    assert write("a", "b") == 422
    grab = {"metadata": {"annotations": {sidecar_access.WRITER_PODS_ANNOTATION: ".*"}}}
    assert write("a", "a", grab) == 422  # the pattern is the operator's to set
    unlabel = {"metadata": {"labels": {c.LABEL_JOB_KIND: None, c.LABEL_COMPONENT: None}}}
    assert write("b", "a", unlabel) == 422  # the old object's labels select it: no escape
    body = {"data": {"record": "x"}}
    assert write(None, "a", body) == 422  # a token bound to no pod


def test_a_pod_writes_only_its_own_ballot(two_jobs: TwoJobs) -> None:
    """Issue 33 item 2: a job's ballot objects (one key per pod) are written by its pods,
    each only its own key: no pod forges, changes or removes another's vote."""
    ns, name = two_jobs.ns, "a-dynamiccl-votes-0"
    pod = "a-worker-0"

    def patch(job: str | None, body: dict[str, Any]) -> int:
        api = two_jobs.api(job)
        return status_of(lambda: api.patch_namespaced_config_map(name, ns, body, dry_run=DRY))

    assert patch("a", {"data": {pod: '{"reported": 64}'}}) == 200  # its own ballot
    admin: Any = k8s.CoreV1Api(two_jobs.rel.api)  # another pod's ballot is there (really)
    admin.patch_namespaced_config_map(name, ns, {"data": {"a-master-0": '{"reported": 64}'}})
    assert patch("a", {"data": {"a-master-0": '{"vote": "forged"}'}}) == 422  # change another's
    assert patch("a", {"data": {"a-master-0": None}}) == 422  # remove another's
    assert patch("a", {"data": {"a-worker-9": "{}"}}) == 422  # a key of no pod it is
    assert patch("a", {"binaryData": {pod: "e30="}}) == 422
    assert patch("b", {"data": {"b-worker-0": "{}"}}) == 422  # another job's pod
    assert patch(None, {"data": {pod: "{}"}}) == 422  # a token bound to no pod


# --- issue 32 A: no writer switches a policy off ----------------------------------------
SELECTING_LABELS = (c.LABEL_JOB_KIND, c.LABEL_COMPONENT, c.LABEL_MANAGED_BY)


@pytest.mark.parametrize("label", SELECTING_LABELS)
def test_a_jobs_own_pod_cannot_unlabel_its_coordination(two_jobs: TwoJobs, label: str) -> None:
    """Issue 32 A, step 1: job a's pod removed the selecting label (patched, before)."""
    assert two_jobs.write("a", "a", {"metadata": {"labels": {label: None}}}) == 422
    relabel = {"metadata": {"labels": {label: "something-else"}}}
    assert two_jobs.write("a", "a", relabel) == 422


def test_an_unlabelled_coordination_configmap_is_still_guarded(two_jobs: TwoJobs) -> None:
    """Issue 32 A, step 2: once the labels are gone (here removed with the operator's
    token, which alone may now: really, not a dry run, on job c's own ConfigMap), job b's
    pod wrote into it and set the pattern to `.*` (patched, before). The policy selects by
    name now: both are refused, job c's own pod still writes."""
    rel = two_jobs.rel
    operator: Any = k8s.CoreV1Api(rel.as_token(rel.token(f"{rel.name}-operator")))
    strip = {"metadata": {"labels": dict.fromkeys(SELECTING_LABELS)}}
    operator.patch_namespaced_config_map("c-dynamiccl-epochs", two_jobs.ns, strip)
    assert two_jobs.write("b", "c") == 422
    grab = {"metadata": {"annotations": {sidecar_access.WRITER_PODS_ANNOTATION: ".*"}}}
    assert two_jobs.write("b", "c", grab) == 422
    assert two_jobs.write("c", "c") == 200


def test_a_pod_cannot_delete_and_recreate_a_coordination_configmap(
    two_jobs: TwoJobs, admin_api: k8s.ApiClient
) -> None:
    """Escape by replacement: a pod whose ServiceAccount may also create and delete
    ConfigMaps (the tenant granted it) removes job a's and creates its own copy."""
    rel, ns = two_jobs.rel, two_jobs.ns
    rbac: Any = k8s.RbacAuthorizationV1Api(admin_api)
    name = f"cm-all-{rel.suffix}"
    rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "delete"]}
    rbac.create_namespaced_role(ns, {"metadata": {"name": name}, "rules": [rule]})
    subject = {"kind": "ServiceAccount", "name": "default", "namespace": ns}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    rbac.create_namespaced_role_binding(
        ns, {"metadata": {"name": name}, "roleRef": ref, "subjects": [subject]}
    )
    time.sleep(1)
    api = two_jobs.api("b")
    cm = "a-dynamiccl-epochs"
    assert status_of(lambda: api.delete_namespaced_config_map(cm, ns, dry_run=DRY)) == 422
    copy = {
        "metadata": {
            "name": "d-dynamiccl-epochs",
            "annotations": {sidecar_access.WRITER_PODS_ANNOTATION: ".*"},
        }
    }
    assert status_of(lambda: api.create_namespaced_config_map(ns, copy, dry_run=DRY)) == 422
    other = {"metadata": {"name": "b-app-settings"}}  # its other ConfigMaps: not ours to guard
    assert status_of(lambda: api.create_namespaced_config_map(ns, other, dry_run=DRY)) == 200


def test_the_node_agent_cannot_describe_another_node(rel: Release) -> None:
    """Issue 32, smaller finding: its own NodeTopology naming another node in spec.nodeName
    (patched, before). The policy is selected by the writer's identity, never by labels:
    an unlabelled object is refused the same."""
    mine, other = two_nodes(rel)
    pod = pod_on(rel, f"{rel.name}-node-agent", mine, "agent-nodename")
    custom: Any = k8s.CustomObjectsApi(rel.as_token(rel.token(f"{rel.name}-node-agent", pod=pod)))
    body = nt.custom_resource(mine)
    body["spec"]["nodeName"] = other
    body["metadata"].pop("labels", None)

    def create() -> Any:
        return custom.create_cluster_custom_object(
            c.GROUP, c.API_VERSION, nt.PLURAL, body, dry_run=DRY
        )

    assert status_of(create) == 422
    body["spec"]["nodeName"] = mine
    assert status_of(create) in (200, 409)  # 409: the agent's topology exists already


def test_the_ingest_cannot_shed_the_jobs_policy_with_labels(
    rel: Release, admin_api: k8s.ApiClient
) -> None:
    """The retraining-Job policy is selected by the writer (the ingest's account): a Job
    without the retraining labels, or with any others, is checked the same."""
    batch: Any = k8s.BatchV1Api(rel.as_token(rel.token(f"{rel.name}-ingest")))
    evil = retrain_job(rel, hostPID=True)
    for labels in ({}, {"app.kubernetes.io/managed-by": "someone-else"}):
        evil["metadata"]["labels"] = labels
        evil["spec"]["template"]["metadata"] = {"labels": labels}
        assert (
            status_of(lambda: batch.create_namespaced_job(rel.namespace, evil, dry_run=DRY)) == 422
        )


# --- issue 32 C: the job's configuration is the operator's alone ------------------------
def tenant(two_jobs: TwoJobs, admin_api: k8s.ApiClient) -> Any:
    """A person with the built-in `edit` role in the jobs' namespace (impersonated)."""
    rel, ns = two_jobs.rel, two_jobs.ns
    user = f"tenant-{rel.suffix}"
    rbac: Any = k8s.RbacAuthorizationV1Api(admin_api)
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"}
    subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
    try:
        rbac.create_namespaced_role_binding(
            ns, {"metadata": {"name": user}, "roleRef": ref, "subjects": [subject]}
        )
        time.sleep(1)
    except ApiException as exc:
        if exc.status != 409:
            raise
    api = k8s.ApiClient(admin_api.configuration, "Impersonate-User", user)
    rel.cleanups.append(api.close)
    return k8s.CoreV1Api(api)


def test_a_tenant_cannot_write_what_the_webhook_injects(
    two_jobs: TwoJobs, admin_api: k8s.ApiClient
) -> None:
    """Issue 32 C: with `edit`, a tenant patched `<job>-dynamiccl`'s env.json (patched,
    before) and the webhook injected NCCL_NET_PLUGIN=/tmp/evil.so, NCCL_BUFFSIZE=-1 into the
    recreated pod. Now only the operator writes it (policy `<release>-job-config`)."""
    rel, ns = two_jobs.rel, two_jobs.ns
    operator: Any = k8s.CoreV1Api(rel.as_token(rel.token(f"{rel.name}-operator")))
    ref = configmap.JobRef("kubeflow.org/v1", "PyTorchJob", "a", ns, "uid-a")
    labels = configmap.labels(ref, "job-config")
    env = {"env.json": '{"NCCL_NTHREADS": "256"}'}
    own = {"metadata": {"name": "a-dynamiccl", "labels": labels}, "data": env}
    assert status_of(lambda: operator.create_namespaced_config_map(ns, own)) == 200
    person = tenant(two_jobs, admin_api)
    evil = {"data": {"env.json": '{"NCCL_NET_PLUGIN": "/tmp/evil.so", "NCCL_BUFFSIZE": "-1"}'}}
    cm = "a-dynamiccl"
    assert status_of(lambda: person.patch_namespaced_config_map(cm, ns, evil, dry_run=DRY)) == 422
    table = {"data": {"table.json": '{"planted": true}'}}
    assert status_of(lambda: person.patch_namespaced_config_map(cm, ns, table, dry_run=DRY)) == 422
    assert status_of(lambda: person.delete_namespaced_config_map(cm, ns, dry_run=DRY)) == 422
    # a job the operator never tuned gets no configuration from the tenant either
    fake = {"metadata": {"name": "b-dynamiccl", "labels": labels}, "data": evil["data"]}
    assert status_of(lambda: person.create_namespaced_config_map(ns, fake, dry_run=DRY)) == 422
    # the tenant's own ConfigMaps are theirs
    mine = {"metadata": {"name": "a-settings"}, "data": evil["data"]}
    assert status_of(lambda: person.create_namespaced_config_map(ns, mine, dry_run=DRY)) == 200
    # nor does a tenant plant a table among the sidecars' published ones
    body = {"data": {"planted": "yes"}}
    tables = "a-dynamiccl-tables"
    assert (
        status_of(lambda: person.patch_namespaced_config_map(tables, ns, body, dry_run=DRY)) == 422
    )
    # the operator still writes its own (it rewrites the ConfigMap at each decision)
    assert status_of(lambda: operator.patch_namespaced_config_map(cm, ns, env, dry_run=DRY)) == 200
