"""Topology specs and job state features (as JSON) that many tests share.

`dgx_h100()` is a topology spec (docs/simulator.md) of DGX H100 nodes: 8 GPUs on
NVSwitch with NVLS, PCIe gen 5, 8x 400 Gb/s InfiniBand, no SHARP.
`h100_job()` wraps it into the state features of a job using every GPU.
"""

from __future__ import annotations

from typing import Any


def dgx_h100(name: str = "dgx-h100", nodes: int = 2, **over: Any) -> dict[str, Any]:
    """The topology spec of `nodes` DGX H100 (keys of `over` replace or add fields)."""
    return {
        "name": name,
        "gpu": "H100",
        "gpus_per_node": 8,
        "nodes": nodes,
        "intra": "nvswitch",
        "nvlink_GBps": 450,
        "nvls": True,
        "pcie_gen": 5,
        "nics_per_node": 8,
        "nic_Gbps": 400,
        "fabric": "infiniband",
        "sharp": False,
        **over,
    }


def h100_job(nodes: int = 2, name: str = "t", **over: Any) -> dict[str, Any]:
    """State features of a job with one 8-GPU pod per DGX H100 node."""
    return {
        "world_size": 8 * nodes,
        "gpus_per_pod": 8,
        "replicas": nodes,
        "nproc_per_node": 8,
        "topology": dgx_h100(name, nodes),
        **over,
    }
