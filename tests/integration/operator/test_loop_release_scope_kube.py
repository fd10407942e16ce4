"""Two releases' learning loops on one REAL kube-apiserver: each follows its own policy.

Two namespaces carry a release label; two NCCLTuningPolicies (the repository's CRD
validates them) select one release's namespaces each. Each release has its own
SQLite store and registry holding the rewards of a job in its namespace, and its
loop talks to the API server through the operator's adapter (`Kube`). After
interleaved ticks, each policy's `status.learning.rollout` names its own
release's promoted model, which a loop following the cluster's one primary policy
could not do (the demo policy is listed first and both have the top priority).

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from dynamiccl.operator.kube import Kube
from dynamiccl.operator.learning.loop import POLICIES, LearningLoop, LoopConfig
from dynamiccl.operator.store.experience import ExperienceStore, open_store
from dynamiccl.operator.store.registry import ModelRegistry
from tests import reward_samples

RELEASES = ("demo", "test")


@pytest.fixture
def cluster(api: k8s.ApiClient) -> Iterator[dict[str, str]]:
    """{release: its namespace}; the policies are `0scope-<release>-<suffix>`."""
    suffix = uuid.uuid4().hex[:6]
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    names = {r: f"scope-{r}-{suffix}" for r in RELEASES}
    for release, ns in names.items():
        labels = {"dynamiccl.io/test-release": f"{release}-{suffix}"}
        core.create_namespace({"metadata": {"name": ns, "labels": labels}})  # type: ignore[arg-type]  # the client takes dict bodies
        custom.create_cluster_custom_object(
            "dynamiccl.io",
            "v1alpha1",
            "nccltuningpolicies",
            {
                "apiVersion": "dynamiccl.io/v1alpha1",
                "kind": "NCCLTuningPolicy",
                # the top priority and a name that sorts first: the cluster's primary
                # whatever other tests leave; the demo one wins over the test one
                "metadata": {"name": f"0scope-{release}-{suffix}"},
                "spec": {
                    "mode": "learned",
                    "priority": 1000,
                    "selector": {"namespaceSelector": {"matchLabels": labels}},
                    "retraining": {"minNewExperience": 100000},
                },
            },
        )
    try:
        yield names
    finally:
        for release, ns in names.items():
            custom.delete_cluster_custom_object(
                "dynamiccl.io", "v1alpha1", "nccltuningpolicies", f"0scope-{release}-{suffix}"
            )
            core.delete_namespace(ns)


def _store(tmp: Path, release: str, namespace: str) -> ExperienceStore:
    store = open_store(str(tmp / f"{release}.db"))
    ModelRegistry(store.backend).bootstrap(f"{release}-v0", sha256="0" * 64, uri="/m.pt")
    job = {"namespace": namespace, "kind": "PyTorchJob", "name": "llm", "uid": f"uid-{release}"}
    pod = {"name": "llm-worker-0", "uid": f"pod-{release}"}
    store.insert_batch(
        reward_samples.batch(
            f"pod-{release}/1", job, pod, [reward_samples.record(16)], model_version=f"{release}-v0"
        )
    )
    return store


def test_each_release_loop_follows_its_own_policy(
    cluster: dict[str, str], cluster_kubeconfig: Path, tmp_path: Path
) -> None:
    kube = Kube(str(cluster_kubeconfig))
    stores = {r: _store(tmp_path, r, cluster[r]) for r in RELEASES}
    try:
        loops = {
            r: LearningLoop(
                stores[r],
                ModelRegistry(stores[r].backend),
                kube,
                LoopConfig(
                    namespace=cluster[r],
                    image="ghcr.io/example/dynamiccl:0.1.0",
                    store_url="sqlite:////var/lib/dynamiccl/experience.db",
                    pvc_name="dynamiccl-store",
                    local_mount_path=str(tmp_path / r),
                ),
            )
            for r in RELEASES
        }
        for r in (*RELEASES, *RELEASES):  # interleaved: neither undoes the other's status
            rep = loops[r].tick()
            assert rep.errors == [], (r, rep.errors)
        suffix = cluster["demo"].rsplit("-", 1)[1]
        for r in RELEASES:
            pol: dict[str, Any] = kube.get(POLICIES, f"0scope-{r}-{suffix}")
            assert pol["status"]["learning"]["rollout"]["promoted"] == f"{r}-v0"
    finally:
        for s in stores.values():
            s.close()
