"""The NodeTopology CRD and kwok nodes owned by these tests.

Cluster: ``cluster_kubeconfig`` / ``admin_api`` of tests/integration/conftest.py
(started if none is reachable; never skipped).
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

from dynamiccl.api import node_topology as nt
from dynamiccl.api.node_topology_crd import node_topology_crd
from dynamiccl.constants import API_VERSION, GROUP

ROOT = Path(__file__).resolve().parents[3]
NODES = 3


def _crd_body() -> dict[str, Any]:
    """The operator's generated CRD when present (what clusters install), else ours."""
    path = ROOT / "crds" / f"{GROUP}_{nt.PLURAL}.yaml"
    if path.is_file():
        body: dict[str, Any] = yaml.safe_load(path.read_text())
        return body
    return node_topology_crd()


@pytest.fixture(scope="module")
def cluster(cluster_kubeconfig: Path, admin_api: k8s.ApiClient) -> Iterator[dict[str, Any]]:
    api = admin_api
    ext, core = k8s.ApiextensionsV1Api(api), k8s.CoreV1Api(api)
    crd = _crd_body()
    try:
        ext.create_custom_resource_definition(crd)  # type: ignore[arg-type]  # the client takes dict bodies
    except ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.time() + 60
    while time.time() < deadline:
        got = ext.read_custom_resource_definition(crd["metadata"]["name"])
        assert got.status is not None
        if any(c.type == "Established" and c.status == "True" for c in got.status.conditions or []):
            break
        time.sleep(0.5)
    run = uuid.uuid4().hex[:6]
    nodes = [f"na-{run}-{i}" for i in range(NODES)]
    for name in nodes:
        core.create_node(
            {  # type: ignore[arg-type]  # the client takes dict bodies
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
                },
                "spec": {
                    "taints": [
                        {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
                    ]
                },
            }
        )
    yield {
        "kubeconfig": str(cluster_kubeconfig),
        "api": api,
        "core": core,
        "custom": k8s.CustomObjectsApi(api),
        "nodes": nodes,
    }
    for name in nodes:
        for fn, args in (
            (
                k8s.CustomObjectsApi(api).delete_cluster_custom_object,
                (GROUP, API_VERSION, nt.PLURAL, name),
            ),
            (core.delete_node, (name,)),
        ):
            try:
                fn(*args)
            except ApiException as exc:
                if exc.status != 404:
                    raise
