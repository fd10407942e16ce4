"""Smoke test of the local control plane: a real PyTorchJob lands on fake GPU nodes.

The real Kubeflow training operator turns a PyTorchJob (1 Master + 1 Worker,
8 GPUs each: a world of 16) into pods, the real kube-scheduler binds them to
kwok GPU nodes, and kwok reports them Running. No image is ever pulled.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynamiccl.testing import builders, scripts

JOB_NAME = "smoke"
GPUS_PER_POD = 8
TIMEOUT_S = 120


def _pytorchjob(name: str) -> dict[str, Any]:
    ct = builders.container(  # "pytorch": the container the operator configures
        gpus=GPUS_PER_POD,
        image="pytorch/pytorch:latest",
        command=["torchrun", "/workspace/train.py"],
        requests={"cpu": "4", "memory": "16Gi"},
    )
    ct["imagePullPolicy"] = "IfNotPresent"
    return builders.pytorchjob(
        name,
        pod=builders.template(ct),
        nproc_per_node=str(GPUS_PER_POD),
        restart_policy="OnFailure",
    )


def _env(pod: Any) -> dict[str, str]:
    container = next(c for c in pod.spec.containers if c.name == "pytorch")
    return {e.name: e.value for e in (container.env or []) if e.value is not None}


def test_fake_gpu_nodes_match_nodes_yaml(cluster: Any) -> None:
    if cluster.log_dir is None:
        pytest.skip("not a hack/cluster-up.sh cluster: its nodes are not hack/nodes.yaml")
    core = cluster.core()
    expected = scripts.load("gen_nodes").expand()
    assert len(expected) >= 16
    for want in expected:
        node = core.read_node(want["metadata"]["name"])
        for key, value in want["metadata"]["labels"].items():
            assert node.metadata.labels.get(key) == value, (node.metadata.name, key)
        for res in ("nvidia.com/gpu", "cpu", "pods"):
            assert node.status.allocatable[res] == want["status"]["allocatable"][res]
            assert node.status.capacity[res] == want["status"]["capacity"][res]
        ready = {c.type: c.status for c in node.status.conditions or []}.get("Ready")
        assert ready == "True", node.metadata.name


def test_pytorchjob_runs_on_fake_gpu_nodes(cluster: Any, namespace: str) -> None:
    core = cluster.core()
    cluster.custom().create_namespaced_custom_object(
        "kubeflow.org", "v1", namespace, "pytorchjobs", _pytorchjob(JOB_NAME)
    )

    selector = f"training.kubeflow.org/job-name={JOB_NAME}"
    deadline = time.monotonic() + TIMEOUT_S
    pods: list[Any] = []
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        if len(pods) == 2 and all(p.status.phase == "Running" for p in pods):
            break
        time.sleep(1)
    else:
        states = [(p.metadata.name, p.status.phase, p.spec.node_name) for p in pods]
        pytest.fail(f"PyTorchJob pods not Running within {TIMEOUT_S}s: {states}")

    by_role = {p.metadata.labels["training.kubeflow.org/replica-type"]: p for p in pods}
    assert set(by_role) == {"master", "worker"}

    # Bound by the scheduler to two distinct GPU nodes (8 GPUs each fill a node).
    node_names = {p.spec.node_name for p in pods}
    assert len(node_names) == 2
    for node_name in node_names:
        node = core.read_node(node_name)
        assert node.metadata.annotations.get("kwok.x-k8s.io/node") == "fake"
        assert node.status.allocatable["nvidia.com/gpu"] == str(GPUS_PER_POD)
        assert node.metadata.labels["nvidia.com/gpu.count"] == str(GPUS_PER_POD)

    # The operator wired up a world of 16 ranks (2 nodes x 8 processes).
    for role, rank in (("master", "0"), ("worker", "1")):
        env = _env(by_role[role])
        assert env["WORLD_SIZE"] == "16"
        assert env["PET_NNODES"] == "2"
        assert env["PET_NPROC_PER_NODE"] == str(GPUS_PER_POD)
        assert env["RANK"] == rank
        assert env["MASTER_ADDR"] == f"{JOB_NAME}-master-0"

    # the training operator writes the job's status after it created the pods (another
    # request): wait for it rather than read it once
    conditions: dict[str, str] = {}
    deadline = time.monotonic() + TIMEOUT_S
    while conditions.get("Created") != "True" and time.monotonic() < deadline:
        job = cluster.custom().get_namespaced_custom_object(
            "kubeflow.org", "v1", namespace, "pytorchjobs", JOB_NAME
        )
        conditions = {c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])}
        if conditions.get("Created") != "True":
            time.sleep(1)
    assert conditions.get("Created") == "True", conditions
