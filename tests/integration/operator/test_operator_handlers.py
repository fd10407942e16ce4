"""`dynamiccl operator` (kopf handlers + webhook) against a REAL kube-apiserver.

Needs the Kubeflow training operator's PyTorchJob CRD (hack/cluster-up.sh
installs it; the test never creates or deletes CRDs of the shared cluster).
The jobs are suspended (``runPolicy.suspend``), so the real training operator
creates no pods; the test plays it instead, creating the job's pods itself
(labels and ownerReferences as the training operator sets them, already bound
to chosen nodes) so that the expected topology is fixed. GPU Node objects of
hack/nodes.yaml are created only if absent (and then deleted again).
Checks: an annotated job gets a ConfigMap and a TuningRun whose features match
the nodes' topology; malformed annotations give an Event and a condition and no
ConfigMap; an unannotated job gets nothing; deleting the job removes the
ConfigMap and TuningRun (ownerReference garbage collection, needs
kube-controller-manager).

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py; the
operator process, jobs and pods: operator_cluster.py.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from tests.integration.operator import operator_cluster as oc
from tests.integration.operator.operator_cluster import PT, wait


@pytest.fixture(scope="module")
def env(
    cluster_kubeconfig: Path, admin_api: k8s.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    with oc.running_operator(cluster_kubeconfig, admin_api, tmp_path_factory) as e:
        yield e


def test_annotated_job_is_tuned_and_refined_by_its_pods(env: dict[str, Any]) -> None:
    core, custom, ns = env["core"], env["custom"], env["ns"]
    job = custom.create_namespaced_custom_object(
        *PT[:2], ns, PT[2], oc.job("llm", {c.ANNOTATION_TUNE: "true"})
    )
    cm = wait("ConfigMap", lambda: core.read_namespaced_config_map("llm-dynamiccl", ns), 90)
    assert cm.metadata.owner_references[0].uid == job["metadata"]["uid"]
    assert json.loads(cm.data["env.json"]) == {"NCCL_NTHREADS": "256"}
    tr = wait(
        "TuningRun",
        lambda: custom.get_namespaced_custom_object(
            "dynamiccl.io", "v1alpha1", ns, "tuningruns", "llm-dynamiccl"
        ),
    )
    assert tr["spec"]["features"]["world_size"] == 24
    for i, node in enumerate(["gpu-h100-00", "gpu-h100-04", "gpu-a100-00"]):
        core.create_namespaced_pod(ns, oc.pod(job, i, node))

    def refined() -> Any:
        t = custom.get_namespaced_custom_object(
            "dynamiccl.io", "v1alpha1", ns, "tuningruns", "llm-dynamiccl"
        )
        # spec and status are two writes: wait for the status that follows the refined spec
        conds = {x["type"]: x["status"] for x in (t.get("status") or {}).get("conditions", [])}
        return (
            t if t["spec"]["features"]["scheduled"] and conds.get("Scheduled") == "True" else None
        )

    tr = wait("features refined from the pods' nodes", refined, 60)
    topo = tr["spec"]["features"]["topology"]
    assert topo["tier_max"] == "cross_zone"  # h100 nodes in local-1a, a100 in local-1b
    assert topo["nodes"] == 3
    assert topo["tier_mix"]["cross_rack"] > 0  # ib-leaf-01 vs ib-leaf-02
    assert topo["intra"] == "nvswitch"
    conds = {x["type"]: x for x in tr["status"]["conditions"]}
    assert conds["Tuned"]["status"] == "True"
    assert conds["Scheduled"]["status"] == "True"
    custom.delete_namespaced_custom_object(
        *PT[:2], ns, PT[2], "llm", body={"propagationPolicy": "Background"}
    )

    def gone() -> bool:
        try:
            core.read_namespaced_config_map("llm-dynamiccl", ns)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait("ownerReference GC of the ConfigMap (kube-controller-manager)", gone, 90)


def test_malformed_annotations_event_and_condition(env: dict[str, Any]) -> None:
    core, custom, ns = env["core"], env["custom"], env["ns"]
    custom.create_namespaced_custom_object(
        *PT[:2],
        ns,
        PT[2],
        oc.job("bad", {c.ANNOTATION_TUNE: "true", c.ANNOTATION_MODEL_SIZE: "huge"}),
    )
    tr = wait(
        "TuningRun with conditions",
        lambda: (
            custom.get_namespaced_custom_object(
                "dynamiccl.io", "v1alpha1", ns, "tuningruns", "bad-dynamiccl"
            ).get("status")
            or {}
        ).get("conditions"),
    )
    conds = {x["type"]: x for x in tr}
    assert conds["AnnotationsValid"]["status"] == "False"
    assert c.ANNOTATION_MODEL_SIZE in conds["AnnotationsValid"]["message"]
    events = wait(
        "Event",
        lambda: [
            e
            for e in core.list_namespaced_event(ns).items
            if e.involved_object.name == "bad" and e.reason == "InvalidAnnotations"
        ],
    )
    assert events[0].type == "Warning"
    with pytest.raises(ApiException) as info:
        core.read_namespaced_config_map("bad-dynamiccl", ns)
    assert info.value.status == 404


def test_unannotated_job_gets_nothing(env: dict[str, Any]) -> None:
    custom, ns = env["custom"], env["ns"]
    custom.create_namespaced_custom_object(*PT[:2], ns, PT[2], oc.job("plain", {}))
    time.sleep(3)
    with pytest.raises(ApiException) as info:
        custom.get_namespaced_custom_object(
            "dynamiccl.io", "v1alpha1", ns, "tuningruns", "plain-dynamiccl"
        )
    assert info.value.status == 404


def _client_with_token(admin: k8s.ApiClient, token: str) -> k8s.ApiClient:
    """An API client that authenticates with a bearer token only (no admin certificate)."""
    src = admin.configuration
    cfg = k8s.Configuration()
    cfg.host = src.host
    cfg.ssl_ca_cert = src.ssl_ca_cert
    cfg.verify_ssl = src.verify_ssl
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return k8s.ApiClient(cfg)


def test_sidecars_coordinate_with_their_pods_token_and_touch_nothing_else(
    env: dict[str, Any],
) -> None:
    """The operator's per-job Role lets the pod's service account run the whole epoch
    protocol (record, lease, tables) and refuses everything else."""
    from dynamiccl.api import sidecar_objects  # noqa: PLC0415
    from dynamiccl.api.epoch import EpochRecord, EpochStatus, resolve, vote  # noqa: PLC0415
    from dynamiccl.api.table import DecisionTable  # noqa: PLC0415
    from dynamiccl.sidecar.cas import load_record, update_record  # noqa: PLC0415
    from dynamiccl.sidecar.config import JobInfo  # noqa: PLC0415
    from dynamiccl.sidecar.kube_cas import KubeCAS, KubeTableStore, ballot_box  # noqa: PLC0415
    from dynamiccl.sidecar.leader import Lease  # noqa: PLC0415
    from dynamiccl.sidecar.proposer import Coordinator, init_record  # noqa: PLC0415

    core, custom, ns = env["core"], env["custom"], env["ns"]
    job = custom.create_namespaced_custom_object(
        *PT[:2], ns, PT[2], oc.job("coord", {c.ANNOTATION_TUNE: "true"})
    )
    wait("ConfigMap", lambda: core.read_namespaced_config_map("coord-dynamiccl", ns), 90)
    rbac = k8s.RbacAuthorizationV1Api(env["api"])
    role = rbac.read_namespaced_role("coord-dynamiccl-sidecar", ns)
    assert role.metadata is not None
    assert role.metadata.owner_references
    assert role.metadata.owner_references[0].uid == job["metadata"]["uid"]
    wait("ServiceAccount default", lambda: core.read_namespaced_service_account("default", ns))
    # the token a sidecar has: bound to a pod of the job, named as the training operator
    # names them (the job is suspended: the test creates it); the chart's coordination
    # admission policy, when installed on this cluster, checks that name
    body = oc.pod(job, 0, "unused")
    body["metadata"]["name"] = "coord-worker-0"
    del body["spec"]["nodeName"]
    pod = core.create_namespaced_pod(ns, body)
    bound = {"kind": "Pod", "apiVersion": "v1"}
    bound |= {"name": pod.metadata.name, "uid": pod.metadata.uid}
    tok = core.create_namespaced_service_account_token(
        "default", ns, {"spec": {"expirationSeconds": 600, "boundObjectRef": bound}}
    ).status.token
    pod_api = _client_with_token(env["api"], tok)
    info = JobInfo(
        namespace=ns,
        name="coord",
        kind="PyTorchJob",
        api_version="kubeflow.org/v1",
        uid=job["metadata"]["uid"],
    )
    record = KubeCAS(pod_api, info, sidecar_objects.epochs_name("coord"), "epoch-record")
    lease = KubeCAS(pod_api, info, sidecar_objects.leader_name("coord"), "leader-lease")
    tables = KubeTableStore(pod_api, info)
    assert record.read()[0] is None  # pre-created empty by the operator
    assert Lease(lease, "pod-0", 30).step()
    assert not Lease(lease, "pod-1", 30).step()
    init_record(record, 256, ("pod-0", "pod-1"))
    table = DecisionTable(version=1, scales=(12,))
    assert Coordinator(record, tables, ballots=ballot_box(pod_api, info, 2)).publish(table) == 1
    assert tables.get(1) == table
    for voter in ("pod-0", "pod-1"):

        def yes(r: EpochRecord, v: str = voter) -> EpochRecord:
            return resolve(vote(r, v, 1, True))

        update_record(record, yes)
    rec, _ = load_record(record)
    assert rec is not None
    assert rec.epochs[0].status == EpochStatus.COMMITTED

    pod_core = k8s.CoreV1Api(pod_api)
    forbidden: list[Callable[[], Any]] = [
        lambda: pod_core.read_namespaced_config_map("coord-dynamiccl", ns),  # the job's config
        lambda: pod_core.list_namespaced_config_map(ns),
        lambda: pod_core.create_namespaced_config_map(
            ns,
            {"metadata": {"name": "x"}},  # type: ignore[arg-type]  # the client takes dict bodies
        ),
        lambda: pod_core.delete_namespaced_config_map(sidecar_objects.epochs_name("coord"), ns),
        lambda: pod_core.read_namespaced_secret("anything", ns),
    ]
    for call in forbidden:
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 403


def test_a_job_keeps_its_model_version_when_the_rollout_changes(env: dict[str, Any]) -> None:
    """The learning loop promotes another model while a job waits for its pods: when the
    pods are bound (a reconcile) the job keeps its model version in the TuningRun, its
    ConfigMap and its table, and the ingest's check still accepts its rewards; a job
    submitted after the change gets the new version."""
    from dynamiccl.api.rewards import JobRef  # noqa: PLC0415
    from dynamiccl.operator.ingest.auth import Caller, authorize  # noqa: PLC0415
    from dynamiccl.operator.ingest.kube import assigned_model_of  # noqa: PLC0415
    from tests import reward_samples  # noqa: PLC0415

    core, custom, ns = env["core"], env["custom"], env["ns"]
    policy = f"all-{ns}"

    def run(name: str) -> Any:
        return custom.get_namespaced_custom_object(
            "dynamiccl.io", "v1alpha1", ns, "tuningruns", f"{name}-dynamiccl"
        )

    def models(name: str) -> tuple[str, str, str]:
        """(TuningRun spec.modelVersion, ConfigMap job.json's, table.json's: a compiled table
        names no version, the empty one of a version that could not be had does)."""
        cm = core.read_namespaced_config_map(f"{name}-dynamiccl", ns)
        meta, table = json.loads(cm.data["job.json"]), json.loads(cm.data["table.json"])
        compiled = table.get("model_version", meta["model_version"])
        return run(name)["spec"]["modelVersion"], meta["model_version"], compiled

    def set_rollout(learning: dict[str, Any] | None) -> None:
        custom.patch_cluster_custom_object_status(
            "dynamiccl.io",
            "v1alpha1",
            "nccltuningpolicies",
            policy,
            {"status": {"learning": learning}},
        )

    job = custom.create_namespaced_custom_object(
        *PT[:2], ns, PT[2], oc.job("sticky", {c.ANNOTATION_TUNE: "true"})
    )
    first = wait("TuningRun", lambda: run("sticky"), 90)["spec"]["modelVersion"]
    assert models("sticky") == (first, first, first)
    promoted = f"v-next-{ns}"
    set_rollout({"rollout": {"promoted": promoted, "canaryPercent": 0}})
    try:
        custom.create_namespaced_custom_object(
            *PT[:2], ns, PT[2], oc.job("after", {c.ANNOTATION_TUNE: "true"})
        )
        wait(
            "the new job on the promoted model",
            lambda: (t := run("after")) and t["spec"]["modelVersion"] == promoted,
            60,
        )
        for i, node in enumerate(["gpu-h100-00", "gpu-h100-04", "gpu-a100-00"]):
            core.create_namespaced_pod(ns, oc.pod(job, i, node))
        wait("reconciled with its pods", lambda: run("sticky")["spec"]["features"]["scheduled"])
        assert models("sticky") == (first, first, first)
        ref = JobRef(namespace=ns, kind="PyTorchJob", name="sticky", uid=job["metadata"]["uid"])
        pod = {"name": "sticky-0", "uid": "pod-sticky"}
        caller = Caller(f"system:serviceaccount:{ns}:default", ns, "default", *pod.values())
        rewards = reward_samples.batch(
            "pod-sticky/1", ref.model_dump(), pod, [reward_samples.record(16)], model_version=first
        )
        assert authorize(caller, rewards, ref, assigned_model_of(run("sticky"), ref)) is None
    finally:
        set_rollout(None)
        for name in ("sticky", "after"):
            custom.delete_namespaced_custom_object(
                *PT[:2], ns, PT[2], name, body={"propagationPolicy": "Background"}
            )


def test_deleting_a_policy_leaves_finished_runs_as_they_ended(env: dict[str, Any]) -> None:
    """A job that finished under a policy keeps it in its TuningRun once the policy is
    deleted; a running job moves to the policy that selects it now (this module's)."""
    custom, ns = env["custom"], env["ns"]
    ntp = ("dynamiccl.io", "v1alpha1", "nccltuningpolicies")
    gone = f"a-gone-{ns}"  # ties this module's policy, and wins it by its smaller name
    select = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
    custom.create_cluster_custom_object(
        *ntp,
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "NCCLTuningPolicy",
            "metadata": {"name": gone},
            "spec": {"mode": "static", "priority": 1000, "selector": select},
        },
    )

    def policy_of(name: str) -> str:
        run = custom.get_namespaced_custom_object(
            "dynamiccl.io", "v1alpha1", ns, "tuningruns", f"{name}-dynamiccl"
        )
        return str(run["spec"]["policyName"])

    def touch(name: str) -> None:  # a job event that changes what its decision depends on
        custom.patch_namespaced_custom_object(
            *PT[:2], ns, PT[2], name, {"metadata": {"labels": {"touched": "yes"}}}
        )

    time.sleep(2)  # the operator's policy cache has the new policy
    for name in ("done", "running"):
        custom.create_namespaced_custom_object(
            *PT[:2], ns, PT[2], oc.job(name, {c.ANNOTATION_TUNE: "true"})
        )
        wait(
            f"{name} tuned under {gone}",
            functools.partial(lambda n: policy_of(n) == gone, name),
            90,
        )
    finished = {"type": "Succeeded", "status": "True", "reason": "JobSucceeded", "message": "ok"}
    custom.patch_namespaced_custom_object_status(
        *PT[:2], ns, PT[2], "done", {"status": {"conditions": [finished]}}
    )
    custom.delete_cluster_custom_object(*ntp, gone)
    time.sleep(2)  # the operator's policy cache has lost it
    touch("done")
    touch("running")
    wait("the running job on the policy that selects it now",
         lambda: policy_of("running") == f"all-{ns}", 60)  # fmt: skip
    time.sleep(2)  # both jobs' events handled
    assert policy_of("done") == gone
