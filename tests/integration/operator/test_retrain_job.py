"""The retraining Job manifest is accepted by a REAL kube-apiserver (server-side dry run).

Cluster: ``admin_api`` of tests/integration/conftest.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from dynamiccl.operator.learning.retrain import RetrainSpec, build_retrain_job


@pytest.fixture
def namespace(admin_api: k8s.ApiClient) -> Iterator[str]:
    ns = f"retrain-{uuid.uuid4().hex[:6]}"
    core = k8s.CoreV1Api(admin_api)
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    yield ns
    core.delete_namespace(ns)


def test_retrain_job_passes_apiserver_validation(admin_api: k8s.ApiClient, namespace: str) -> None:
    spec = RetrainSpec(
        policy_name="default",
        policy_uid=str(uuid.uuid4()),
        namespace=namespace,
        image="ghcr.io/example/dynamiccl:0.1.0",
        store_url="postgresql://dynamiccl@db:5432/dynamiccl",
        new_version="default-20250101000000",
        parent_version="default",
        pvc_name="dynamiccl-experience",
        colocate_with={"app.kubernetes.io/name": "dynamiccl-operator"},
    )
    manifest = build_retrain_job(spec)
    created = k8s.BatchV1Api(admin_api).create_namespaced_job(
        namespace,
        manifest,  # type: ignore[arg-type]  # the client takes dict bodies
        dry_run="All",
    )
    meta = created.metadata
    assert meta is not None
    assert meta.owner_references
    assert meta.name == manifest["metadata"]["name"]
    assert meta.owner_references[0].kind == "NCCLTuningPolicy"
    assert created.spec is not None
    pod = created.spec.template.spec
    assert pod is not None
    assert pod.containers[0].command is not None
    assert pod.containers[0].command[:2] == ["dynamiccl", "train"]
    assert pod.security_context is not None
    assert pod.security_context.run_as_non_root is True
    assert pod.affinity is not None
    assert pod.affinity.pod_affinity is not None
    assert pod.affinity.pod_affinity.required_during_scheduling_ignored_during_execution
    # dry run: nothing was persisted
    assert k8s.BatchV1Api(admin_api).list_namespaced_job(namespace).items == []
