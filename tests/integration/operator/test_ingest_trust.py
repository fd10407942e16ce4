"""Forged jobs at the ingest, against a REAL kube-apiserver (issue 19, item 1).

A pod's token is genuine in every attempt here (TokenRequest bound to a real
pod); what is forged is the pod's claim on a job: a bare pod with a copied or
made-up controller ownerReference, a Deployment's pod reporting as its
ReplicaSet, a job DynamICCL never tuned, a model version the operator did not
assign. Each must be answered 403 and store nothing; the control (a real
PyTorchJob pod reporting its assigned version) 200.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from dynamiccl import constants as c
from dynamiccl.operator.controller.configmap import object_name
from tests.integration.operator.ingest_cluster import (
    IngestProcess,
    Kube,
    Workload,
    batch,
    expect_rejected,
    make_job,
    make_namespace,
    mint,
    name_uid,
)


@pytest.fixture(scope="module")
def kube(cluster_kubeconfig: Path, api: k8s.ApiClient) -> Kube:
    return Kube(cluster_kubeconfig, api)


@pytest.fixture(scope="module")
def ns(kube: Kube) -> Iterator[str]:
    name = f"ingest-t-{uuid.uuid4().hex[:6]}"
    make_namespace(kube, name, "trainer", "intruder")
    yield name
    kube.core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="module")
def victim(kube: Kube, ns: str) -> Workload:
    return make_job(kube, ns, "victim", 1)


@pytest.fixture(scope="module")
def ingest(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IngestProcess]:
    tmp = tmp_path_factory.mktemp("ingest-trust")
    p = IngestProcess(f"sqlite:///{tmp / 'experience.db'}", kube, tmp / "tls")
    p.start()
    yield p
    p.stop()


def bare_pod(
    kube: Kube, ns: str, sa: str, owner: dict[str, Any] | None, finalizers: list[str] | None = None
) -> tuple[str, str]:
    """A pod claiming `owner`. With `finalizers` it is never scheduled: kwok, which plays the
    kubelet of every node here, strips the finalizers of the pods it runs when they are deleted."""
    meta: dict[str, Any] = {"generateName": "forged-", "finalizers": finalizers or []}
    nowhere = {"nodeSelector": {"dynamiccl.io/no-such-node": "true"}} if finalizers else {}
    if owner is not None:
        meta["ownerReferences"] = [owner | {"controller": True}]
    pod = kube.core.create_namespaced_pod(
        ns,
        {  # type: ignore[arg-type]  # the client takes dict bodies
            "metadata": meta,
            "spec": {
                "serviceAccountName": sa,
                "automountServiceAccountToken": False,
                "containers": [{"name": "x", "image": "example.invalid/x:1"}],
                **nowhere,
            },
        },
    )
    return name_uid(pod)


def forged(w: Workload, pod: tuple[str, str], job: dict[str, str], seq: int) -> dict[str, Any]:
    return batch(Workload(w.namespace, job, [pod]), 0, seq)


def pt_owner(job: dict[str, str], uid: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": job["name"],
        "uid": uid or job["uid"],
    }


def test_control_real_pod_with_assigned_model_is_accepted(
    kube: Kube, victim: Workload, ingest: IngestProcess
) -> None:
    tok = mint(kube, victim.namespace, victim.pods[0])
    assert ingest.post(batch(victim, 0, seq=1), tok)[0] == 200


def test_bare_pod_copying_the_jobs_owner_reference_under_another_account_is_403(
    kube: Kube, ns: str, victim: Workload, ingest: IngestProcess
) -> None:
    pod = bare_pod(kube, ns, "intruder", pt_owner(victim.job))
    tok = mint(kube, ns, pod, sa="intruder")
    expect_rejected(ingest, forged(victim, pod, victim.job, 1), tok, 403)


HOLD: str = "dynamiccl.io/test-hold"  # a finalizer of this test's: the pod outlives the GC's delete


def test_owner_reference_with_a_wrong_uid_is_403(
    kube: Kube, ns: str, victim: Workload, ingest: IngestProcess
) -> None:
    # A uid no PyTorchJob named so has: the garbage collector deletes such a pod within about
    # a second (its owner is dangling). The pod holds a finalizer of ours (and is never
    # scheduled, see bare_pod), so the delete only marks it and the token can be minted however
    # slow this machine is (fc15, under two busy loops, lost 5 races of create + mint against
    # the GC). Answered 403 while the pod exists
    # unmarked, 401 if the token's pod counts as deleted: refused either way.
    owner_uid = str(uuid.uuid4())
    pod = bare_pod(kube, ns, "trainer", pt_owner(victim.job, uid=owner_uid), finalizers=[HOLD])
    try:
        tok = mint(kube, ns, pod)
        forged_uid = victim.job | {"uid": owner_uid}
        expect_rejected(ingest, forged(victim, pod, forged_uid, 1), tok, (401, 403))
        expect_rejected(ingest, forged(victim, pod, victim.job, 2), tok, (401, 403))
    finally:
        kube.core.patch_namespaced_pod(pod[0], ns, {"metadata": {"finalizers": None}})


def test_made_up_kind_is_403(kube: Kube, ns: str, victim: Workload, ingest: IngestProcess) -> None:
    uid = str(uuid.uuid4())
    owner = {"apiVersion": "example.com/v1", "kind": "FancyJob", "name": "fancy", "uid": uid}
    pod = bare_pod(kube, ns, "trainer", owner)
    job = {"namespace": ns, "kind": "FancyJob", "name": "fancy", "uid": uid}
    expect_rejected(ingest, forged(victim, pod, job, 1), mint(kube, ns, pod), 403)


def test_deployment_pod_reporting_as_its_replicaset_is_403(
    kube: Kube, ns: str, victim: Workload, ingest: IngestProcess
) -> None:
    apps = k8s.AppsV1Api(kube.api)
    labels = {"app": "web"}
    apps.create_namespaced_deployment(
        ns,
        {  # type: ignore[arg-type]  # the client takes dict bodies
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "trainer",
                        "automountServiceAccountToken": False,
                        "containers": [{"name": "web", "image": "example.invalid/web:1"}],
                    },
                },
            },
        },
    )
    deadline = time.monotonic() + 60
    pods: list[k8s.V1Pod] = []
    while time.monotonic() < deadline and not pods:
        pods = kube.core.list_namespaced_pod(ns, label_selector="app=web").items
        time.sleep(0.3)
    assert pods, "the Deployment controller created no pod"
    owner = (pods[0].metadata.owner_references or [])[0]  # type: ignore[union-attr]
    assert owner.kind == "ReplicaSet"
    pod = name_uid(pods[0])
    rs = {"namespace": ns, "kind": "ReplicaSet", "name": owner.name, "uid": owner.uid}
    expect_rejected(ingest, forged(victim, pod, rs, 1), mint(kube, ns, pod), 403)


def test_job_dynamiccl_does_not_tune_is_403(
    kube: Kube, ns: str, victim: Workload, ingest: IngestProcess
) -> None:
    w = make_job(kube, ns, "untuned", 1, tuned=False)
    resp = expect_rejected(ingest, batch(w, 0, seq=1), mint(kube, ns, w.pods[0]), 403)
    assert "not a job DynamICCL tunes" in resp["detail"]


def test_model_version_other_than_assigned_is_403_until_the_operator_assigns_it(
    kube: Kube, ns: str, ingest: IngestProcess
) -> None:
    w = make_job(kube, ns, "canary", 1)
    tok = mint(kube, ns, w.pods[0])
    resp = expect_rejected(ingest, batch(w, 0, seq=1) | {"model_version": "v9"}, tok, 403)
    assert "assigned model 'v1'" in resp["detail"]
    # a rollout assigns v9: after the cache's minimum refresh interval v9 is accepted
    kube.custom.patch_namespaced_custom_object(
        c.GROUP,
        c.API_VERSION,
        ns,
        "tuningruns",
        object_name("canary"),
        {"spec": {"modelVersion": "v9"}},
    )
    time.sleep(2.2)
    assert ingest.post(batch(w, 0, seq=2) | {"model_version": "v9"}, tok)[0] == 200


def test_absurd_times_are_422_and_store_nothing(
    kube: Kube, victim: Workload, ingest: IngestProcess
) -> None:
    """Item 5: a 1e-300 µs mean made the job's speedup overflow its TuningRun status."""
    tok = mint(kube, victim.namespace, victim.pods[0])
    body = batch(victim, 0, seq=500)
    body["records"][0] |= {"mean_time_us": 1e-300, "p50_time_us": 1e-300}
    resp = expect_rejected(ingest, body, tok, 422)
    assert "mean_time_us" in resp["detail"]
