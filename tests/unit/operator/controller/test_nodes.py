"""Node facts from NodeTopology objects and from other agents' labels."""

from __future__ import annotations

from typing import Any

from dynamiccl.api import node_topology as nt
from dynamiccl.api.topology import Fabric, Intra, TopologySpec
from dynamiccl.operator.controller import nodes


def test_gpu_model_from_gfd_products() -> None:
    assert nodes.gpu_model("NVIDIA-H100-80GB-HBM3") == "H100"
    assert nodes.gpu_model("NVIDIA-A100-SXM4-80GB") == "A100"
    assert nodes.gpu_model("NVIDIA-L40S") == "L40S"
    assert nodes.gpu_model("NVIDIA-GeForce-RTX-3080") == "RTX3080"
    assert nodes.gpu_model("Tesla-X9") is None


def test_kwok_h100_node_from_labels(kwok_nodes: dict[str, dict[str, Any]]) -> None:
    f = nodes.node_facts(kwok_nodes["gpu-h100-00"])
    assert f.spec.gpu == "H100"
    assert f.spec.gpus_per_node == 8
    assert f.spec.intra is Intra.NVSWITCH
    assert f.spec.nvls is True
    assert f.spec.fabric is Fabric.INFINIBAND
    assert (f.zone, f.leaf) == ("local-1a", "ib-leaf-01")
    assert "nics_per_node" in f.unknown
    assert "fabric" in f.unknown  # RDMA says IB or RoCE, not which


def test_kwok_l40s_node_is_pcie_ethernet(kwok_nodes: dict[str, dict[str, Any]]) -> None:
    f = nodes.node_facts(kwok_nodes["gpu-l40s-00"])
    assert (f.spec.intra, f.spec.nvlink_GBps, f.spec.nvls) == (Intra.PCIE, 0, False)
    assert f.spec.fabric is Fabric.ETHERNET


def test_node_topology_wins_over_labels(kwok_nodes: dict[str, dict[str, Any]]) -> None:
    spec = TopologySpec(
        name="n",
        gpu="H200",
        gpus_per_node=8,
        nodes=1,
        intra=Intra.NVSWITCH,
        nvlink_GBps=450,
        nvls=True,
        pcie_gen=5,
        nics_per_node=8,
        nic_Gbps=400,
        fabric=Fabric.ROCE,
        sharp=False,
    )
    obj = nt.custom_resource("gpu-h100-00", nt.NodeTopology(node_name="gpu-h100-00", spec=spec))
    f = nodes.node_facts(kwok_nodes["gpu-h100-00"], obj)
    assert f.from_node_topology
    assert (f.spec.gpu, f.spec.fabric, f.unknown) == ("H200", Fabric.ROCE, ())


def test_bare_node_is_all_unknown_but_valid() -> None:
    f = nodes.node_facts({"metadata": {"name": "x"}})
    assert {"gpu", "gpus_per_node", "intra"} <= set(f.unknown)
    assert f.spec.intra is Intra.PCIE


def test_facts_are_memoised_on_content_not_identity(kwok_nodes: dict[str, dict[str, Any]]) -> None:
    node = kwok_nodes["gpu-h100-00"]
    first = nodes.node_facts(node)
    copy = {"metadata": {"name": node["metadata"]["name"],
                         "labels": dict(node["metadata"]["labels"])},
            "status": {"capacity": {"nvidia.com/gpu": "8"}}}  # fmt: skip
    assert nodes.node_facts(copy) is first  # same inputs: computed once
    copy["metadata"]["labels"]["topology.kubernetes.io/zone"] = "elsewhere"
    moved = nodes.node_facts(copy)
    assert moved.zone == "elsewhere"
    assert first.zone == "local-1a"  # the earlier result is untouched
    spec = TopologySpec(name="x", gpu="B200", gpus_per_node=8, nodes=1, intra=Intra.NVSWITCH,
                        nvlink_GBps=900, nvls=True, pcie_gen=6, nics_per_node=8, nic_Gbps=400,
                        fabric=Fabric.INFINIBAND, sharp=False)  # fmt: skip
    topo = {"status": {"spec": spec.model_dump(mode="json")}}
    assert nodes.node_facts(copy, topo).spec.gpu == "B200"  # the NodeTopology is part of the key
