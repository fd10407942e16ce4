"""Attack: a node agent publishes a topology file for another node (docs/security.md).

A node's NCCL topology file reaches every tuned pod on that node (operator/controller/
topo_files.py), so only that node's agent may publish it: the chart's node-agent policy
lets an agent's pod-bound token write only the NodeTopology named after its own node, its
status (where ``ncclTopoFile`` lives) included. Needs the lead's control plane."""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dynamiccl import constants as c
from dynamiccl.api import node_topology as nt
from tests.integration.operator.chart_cluster import Release, status_of
from tests.integration.operator.test_trust_boundaries_kube import (
    DENIED,
    pod_on,
    rel,
    two_nodes,
)

__all__ = ["rel"]  # the module's release fixture (chart installed with its policies)

EVIL = '<system version="1"><cpu numaid="0"><pci busid="0000:00:00.0"/></cpu></system>\n'


def _ensure(admin: Any, node: str) -> dict[str, Any]:
    try:
        admin.create_cluster_custom_object(
            c.GROUP, c.API_VERSION, nt.PLURAL, nt.custom_resource(node)
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    obj: dict[str, Any] = admin.get_cluster_custom_object(c.GROUP, c.API_VERSION, nt.PLURAL, node)
    return obj


def test_a_node_agent_publishes_a_topology_file_only_for_its_own_node(
    rel: Release, admin_api: k8s.ApiClient
) -> None:
    mine, other = two_nodes(rel)
    admin: Any = k8s.CustomObjectsApi(admin_api)
    pod = pod_on(rel, f"{rel.name}-node-agent", mine, "agent-topo-file")
    agent: Any = k8s.CustomObjectsApi(rel.as_token(rel.token(f"{rel.name}-node-agent", pod=pod)))

    def publish(node: str) -> int:
        obj = _ensure(admin, node)
        obj["status"] = nt.NodeTopology(
            node_name=node, nccl_topo_file=nt.NcclTopoFile(reason="attack", xml=EVIL)
        ).wire()
        # a merge patch, as the node agent publishes (node_agent/kube.py): its RBAC grants
        # get/create/patch, not update, so a replace would be refused for every node alike
        return status_of(
            lambda: agent.patch_cluster_custom_object_status(
                c.GROUP, c.API_VERSION, nt.PLURAL, node, {"status": obj["status"]}, dry_run="All"
            )
        )

    assert publish(other) in DENIED
    assert publish(mine) == 200
    # the same ServiceAccount's token bound to no pod (so to no node) publishes nothing
    loose: Any = k8s.CustomObjectsApi(rel.as_token(rel.token(f"{rel.name}-node-agent")))
    obj = _ensure(admin, mine)
    obj["status"] = nt.NodeTopology(
        node_name=mine, nccl_topo_file=nt.NcclTopoFile(reason="attack", xml=EVIL)
    ).wire()
    assert (
        status_of(
            lambda: loose.patch_cluster_custom_object_status(
                c.GROUP, c.API_VERSION, nt.PLURAL, mine, {"status": obj["status"]}, dry_run="All"
            )
        )
        in DENIED
    )
