"""Shared by the operator integration tests: `dynamiccl operator` running against the real
kube-apiserver, and the PyTorchJobs and pods the tests play the training operator with.

Not a test module: test_operator_handlers.py imports it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.testing import builders, scripts
from dynamiccl.testing.ports import free_port
from dynamiccl.testing.waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
PT = ("kubeflow.org", "v1", "pytorchjobs")


wait = wait_for  # the tests' name for it


@contextlib.contextmanager
def running_operator(
    cluster_kubeconfig: Path, admin_api: k8s.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """`dynamiccl operator` as its own process, watching a fresh namespace that one static
    NCCLTuningPolicy (NCCL_NTHREADS=256) selects; three GPU nodes of hack/nodes.yaml made
    if absent. Yields api, core, custom, ns and proc; removes what it made."""
    api = admin_api
    ext, core = k8s.ApiextensionsV1Api(api), k8s.CoreV1Api(api)
    for p in sorted((ROOT / "crds").glob("*.yaml")):
        body = yaml.safe_load(p.read_text())
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
    try:
        ext.read_custom_resource_definition("pytorchjobs.kubeflow.org")
    except ApiException as exc:
        if exc.status != 404:
            raise
        pytest.skip("no PyTorchJob CRD: install the training operator (hack/cluster-up.sh)")
    custom = k8s.CustomObjectsApi(api)
    wait("PyTorchJob CRD", lambda: custom.list_cluster_custom_object(*PT) is not None)
    gen = scripts.load("gen_nodes")
    created_nodes: list[str] = []
    for node in gen.expand():
        if node["metadata"]["name"] not in ("gpu-h100-00", "gpu-h100-04", "gpu-a100-00"):
            continue
        node.pop("status", None)
        try:
            core.create_node(node)
            created_nodes.append(node["metadata"]["name"])
        except ApiException as exc:
            if exc.status != 409:
                raise
    for name in created_nodes:  # capacity for GPU counts (cluster-up's nodes have it)
        core.patch_node_status(name, {"status": {"capacity": {c.RESOURCE_GPU: "8"}}})
    ns = f"dyn-h-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]  # the client takes dict bodies
    policy = f"all-{ns}"
    custom.create_cluster_custom_object(
        "dynamiccl.io",
        "v1alpha1",
        "nccltuningpolicies",
        {
            "apiVersion": "dynamiccl.io/v1alpha1",
            "kind": "NCCLTuningPolicy",
            "metadata": {"name": policy},
            "spec": {
                "mode": "static",
                "priority": 1000,
                "selector": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
                },
                "constraints": {
                    "envKnobs": [{"name": "NCCL_NTHREADS", "allowed": [256], "default": 256}]
                },
            },
        },
    )
    port = free_port()
    # A file, not a pipe nobody reads: a full pipe would block the operator's logging.
    log = (tmp_path_factory.mktemp("operator") / "operator.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynamiccl.cli",
            "operator",
            "--kubeconfig",
            str(cluster_kubeconfig),
            "--namespace",
            ns,
            "--webhook-host",
            "127.0.0.1",
            "--webhook-port",
            str(port),
            "--metrics-port",
            "0",
            "--webhook-config",
            "none",
            "--extra-san",
            "127.0.0.1",
            "--watch-namespace",
            ns,
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        yield {"api": api, "core": core, "custom": custom, "ns": ns, "proc": proc}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        custom.delete_cluster_custom_object(
            "dynamiccl.io", "v1alpha1", "nccltuningpolicies", policy
        )
        core.delete_namespace(ns)
        for name in created_nodes:
            core.delete_node(name)


def job(name: str, ann: dict[str, str]) -> dict[str, Any]:
    """A suspended PyTorchJob (Master + 2 Workers, 8 GPUs each) with annotations `ann`.

    The real training operator creates no pods for a suspended job: the test does."""
    ct = builders.container(image="example.invalid/t:1")
    return builders.pytorchjob(
        name, annotations=ann, workers=2, pod=builders.template(ct), suspend=True
    )


def pod(job: dict[str, Any], i: int, node: str) -> dict[str, Any]:
    """Worker pod `i` of `job`, bound to `node`, as the training operator would make it."""
    name = job["metadata"]["name"]
    return {
        "metadata": {
            "name": f"{name}-{i}",
            "labels": {c.LABEL_KUBEFLOW_JOB_NAME: name, c.LABEL_KUBEFLOW_REPLICA_TYPE: "worker"},
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "pytorch", "image": "example.invalid/t:1"}],
        },
    }
