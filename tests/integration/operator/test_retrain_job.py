"""The retraining Job manifest is accepted by a REAL kube-apiserver (server-side dry run).

Cluster: $DYNAMICCL_KUBECONFIG / $KUBECONFIG, else the local control plane
(hack/cluster-up.sh, started if needed).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from dynamiccl.operator.retrain import RetrainSpec, build_retrain_job

ROOT = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("DYNAMICCL_CACHE", str(Path.home() / ".cache/dynamiccl/v1")))


def _api() -> k8s.ApiClient | None:
    for var in ("DYNAMICCL_KUBECONFIG", "KUBECONFIG"):
        if os.environ.get(var):
            kc = Path(os.environ[var].split(os.pathsep)[0]).expanduser()
            break
    else:
        kc = CACHE / "cluster" / "kubeconfig"
    try:
        api = k8s_config.new_client_from_config(config_file=str(kc))
        k8s.VersionApi(api).get_code(_request_timeout=5)
    except Exception:
        return None
    return api


@pytest.fixture(scope="module")
def api() -> k8s.ApiClient:
    got = _api()
    if got is None:
        subprocess.run(["bash", str(ROOT / "hack" / "cluster-up.sh")], check=False, timeout=3600)
        got = _api()
    if got is None:
        pytest.fail("no reachable kube-apiserver (hack/cluster-up.sh)")
    return got


@pytest.fixture
def namespace(api: k8s.ApiClient) -> Iterator[str]:
    ns = f"retrain-{uuid.uuid4().hex[:6]}"
    core = k8s.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": ns}})
    yield ns
    core.delete_namespace(ns)


def test_retrain_job_passes_apiserver_validation(api: k8s.ApiClient, namespace: str) -> None:
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
    created = k8s.BatchV1Api(api).create_namespaced_job(namespace, manifest, dry_run="All")
    assert created.metadata.name == manifest["metadata"]["name"]
    assert created.metadata.owner_references[0].kind == "NCCLTuningPolicy"
    pod = created.spec.template.spec
    assert pod.containers[0].command[:2] == ["dynamiccl", "train"]
    assert pod.security_context.run_as_non_root is True
    assert pod.affinity.pod_affinity.required_during_scheduling_ignored_during_execution
    # dry run: nothing was persisted
    assert k8s.BatchV1Api(api).list_namespaced_job(namespace).items == []
