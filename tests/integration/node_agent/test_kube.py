"""KubeAdapter against a REAL kube-apiserver: reads, writes, replace semantics, errors.

Cluster: the ``cluster`` fixture of conftest.py, on tests/integration/conftest.py's
(started if none is reachable; never skipped).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dynamiccl.api import node_topology as nt
from dynamiccl.node_agent.kube import KubeAdapter, KubeError


@pytest.fixture
def adapter(cluster: dict[str, Any]) -> Iterator[KubeAdapter]:
    a = KubeAdapter(cluster["kubeconfig"])
    yield a
    a.close()


def test_missing_objects_read_as_none(adapter: KubeAdapter) -> None:
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    assert adapter.get_node_labels(ghost) is None
    assert adapter.get_topology(ghost) is None


def test_status_is_replaced_not_merged(cluster: dict[str, Any], adapter: KubeAdapter) -> None:
    name = cluster["nodes"][2]
    if adapter.get_topology(name) is None:
        adapter.create_topology(nt.custom_resource(name))
    with pytest.raises(KubeError, match="HTTP 409"):
        adapter.create_topology(nt.custom_resource(name))
    first = nt.NodeTopology(node_name=name, nics_per_node=2, nic_gbps=100.0).wire()
    first["spec"] = {
        "name": name, "gpu": "L40S", "gpus_per_node": 8, "nodes": 1, "intra": "pcie",
        "nvlink_GBps": 0, "nvls": False, "pcie_gen": 4, "nics_per_node": 2, "nic_Gbps": 100,
        "fabric": "ethernet", "sharp": False, "gdr": False,
    }  # fmt: skip
    adapter.replace_topology_status(name, first)
    got = adapter.get_topology(name)
    assert got is not None
    assert got["status"]["spec"]["gdr"] is False  # extra spec keys are preserved
    second = nt.NodeTopology(node_name=name).wire()
    adapter.replace_topology_status(name, second)
    got = adapter.get_topology(name)
    assert got is not None
    assert "spec" not in got["status"]  # a vanished key is gone, not merged
    assert "nicsPerNode" not in got["status"]  # nulls are pruned by the schema


def test_schema_violations_are_named(cluster: dict[str, Any], adapter: KubeAdapter) -> None:
    name = cluster["nodes"][2]
    bad = nt.NodeTopology(node_name=name).wire()
    bad["intra"] = "warp-drive"
    with pytest.raises(KubeError, match=r"HTTP 422: .*intra"):
        adapter.replace_topology_status(name, bad)


def test_labels_set_and_removed(cluster: dict[str, Any], adapter: KubeAdapter) -> None:
    name = cluster["nodes"][1]
    adapter.patch_node_labels(name, {"dynamiccl.io/test": "x"})
    labels = adapter.get_node_labels(name)
    assert labels is not None
    assert labels["dynamiccl.io/test"] == "x"
    adapter.patch_node_labels(name, {"dynamiccl.io/test": None})
    labels = adapter.get_node_labels(name)
    assert labels is not None
    assert "dynamiccl.io/test" not in labels
    assert labels["kubernetes.io/hostname"] == name
