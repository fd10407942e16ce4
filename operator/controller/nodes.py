"""What a node tells us about its communication topology.

Preferred source: the node's ``NodeTopology`` object (``status.spec``, written by
our node agent from sysfs/NVML). Fallback: labels other agents publish —
NVIDIA GPU Feature Discovery (``nvidia.com/gpu.product``), topograph
(``network.topology.nvidia.com/{accelerator,leaf,spine}``), Node Feature
Discovery (``feature.node.kubernetes.io/rdma.available``), the well-known zone
label, and our node agent's ``dynamiccl.io/*`` labels. Every value taken from a
catalog default instead of an observation is named in ``unknown``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from pydantic import ValidationError

from dynamiccl import constants as c
from dynamiccl.api.topology import Fabric, Intra, TopologySpec


@dataclass(frozen=True)
class GpuDefaults:
    """Catalog facts about a GPU model (per-GPU NVLink GB/s unidirectional, PCIe gen)."""

    nvlink_GBps: float  # noqa: N815 - spec spelling
    pcie_gen: int
    nvls_capable: bool  # NVLink SHARP with an NVSwitch (Hopper and later)


# Public datasheet figures; NVLink bandwidth is per GPU, one direction.
GPU_CATALOG: Final = {
    "V100": GpuDefaults(150, 3, False),
    "A100": GpuDefaults(300, 4, False),
    "A800": GpuDefaults(200, 4, False),
    "H100": GpuDefaults(450, 5, True),
    "H800": GpuDefaults(200, 5, True),
    "H200": GpuDefaults(450, 5, True),
    "B200": GpuDefaults(900, 6, True),
    "GB200": GpuDefaults(900, 6, True),
    "L40S": GpuDefaults(0, 4, False),
    "L40": GpuDefaults(0, 4, False),
    "L4": GpuDefaults(0, 4, False),
    "A10": GpuDefaults(0, 4, False),
    "RTX3080": GpuDefaults(0, 4, False),
}


def gpu_model(product: str) -> str | None:
    """Short model from a GFD product label (``NVIDIA-H100-80GB-HBM3`` → ``H100``)."""
    parts = [p.upper() for p in product.replace("_", "-").split("-") if p]
    if parts and parts[0] == "NVIDIA":
        parts = parts[1:]
    for part in parts:
        if part in GPU_CATALOG:
            return part
    for part in parts:  # GeForce-RTX-3080 and similar
        if part.startswith("RTX") or part.isdigit():
            joined = "RTX" + part if part.isdigit() else part
            if joined in GPU_CATALOG:
                return joined
    return None


@dataclass(frozen=True)
class NodeFacts:
    """One node's topology as far as it is known."""

    name: str
    spec: TopologySpec  # nodes: 1
    zone: str | None
    leaf: str | None
    nvlink_domain: str | None
    unknown: tuple[str, ...] = ()
    from_node_topology: bool = False


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, Mapping) else {}


def _truthy(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.strip().lower() in ("true", "1", "yes")


def _capacity_gpus(node: Mapping[str, Any]) -> int | None:
    for part in ("capacity", "allocatable"):
        value = ((node.get("status") or {}).get(part) or {}).get(c.RESOURCE_GPU)
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None


def _spec_from_node_topology(obj: Mapping[str, Any] | None) -> TopologySpec | None:
    raw = ((obj or {}).get("status") or {}).get("spec")
    if not isinstance(raw, Mapping):
        return None
    try:
        return TopologySpec.model_validate(raw).model_copy(update={"nodes": 1})
    except ValidationError:
        return None


def node_facts(
    node: Mapping[str, Any], node_topology: Mapping[str, Any] | None = None
) -> NodeFacts:
    """Facts of one Node object (+ its NodeTopology object if there is one).

    Memoised on what they are computed from (name, labels, GPU capacity, the
    NodeTopology spec): a job's reconcile describes up to 512 cluster nodes, and
    nodes rarely change.
    """
    name = str((node.get("metadata") or {}).get("name", ""))
    labels = tuple(sorted((str(k), str(v)) for k, v in _labels(node).items()))
    spec = ((node_topology or {}).get("status") or {}).get("spec")
    topo = json.dumps(spec, sort_keys=True, default=str) if spec is not None else None
    return _facts(name, labels, _capacity_gpus(node), topo)


@lru_cache(maxsize=4096)
def _facts(
    name: str, labels: tuple[tuple[str, str], ...], gpus: int | None, topo: str | None
) -> NodeFacts:
    node: dict[str, Any] = {"metadata": {"name": name, "labels": dict(labels)}}
    if gpus is not None:
        node["status"] = {"capacity": {c.RESOURCE_GPU: str(gpus)}}
    node_topology = {"status": {"spec": json.loads(topo)}} if topo is not None else None
    return _node_facts(node, node_topology)


def _node_facts(node: Mapping[str, Any], node_topology: Mapping[str, Any] | None) -> NodeFacts:
    name = str((node.get("metadata") or {}).get("name", ""))
    labels = _labels(node)
    zone = labels.get(c.NODE_LABEL_ZONE)
    leaf = labels.get(c.NODE_LABEL_TOPO_LEAF)
    domain = labels.get(c.NODE_LABEL_TOPO_ACCELERATOR)
    spec = _spec_from_node_topology(node_topology)
    if spec is not None:
        return NodeFacts(name, spec, zone, leaf, domain, (), True)
    return _facts_from_labels(name, node=node, labels=labels, zone=zone, leaf=leaf, domain=domain)


def _facts_from_labels(
    name: str,
    *,
    node: Mapping[str, Any],
    labels: Mapping[str, str],
    zone: str | None,
    leaf: str | None,
    domain: str | None,
) -> NodeFacts:
    unknown: list[str] = []
    product = labels.get(c.NODE_LABEL_GPU_PRODUCT) or labels.get(c.NODE_LABEL_GFD_PRODUCT) or ""
    model = gpu_model(product) if product else None
    if model is None:
        unknown.append("gpu")
    defaults = GPU_CATALOG.get(model or "", GpuDefaults(0, 4, False))
    gpus = _capacity_gpus(node)
    if gpus is None:
        count = labels.get(c.NODE_LABEL_GFD_COUNT, "")
        gpus = int(count) if count.isdigit() else None
    if not gpus:
        unknown.append("gpus_per_node")
    nvswitch = _truthy(labels.get(c.NODE_LABEL_NVSWITCH))
    if nvswitch is None:
        nvswitch = domain is not None  # topograph sets the NVLink domain on NVSwitch nodes
        unknown.append("intra")
    nvlink = _truthy(labels.get(c.NODE_LABEL_NVLINK))
    if nvswitch:
        intra = Intra.NVSWITCH
    elif nvlink:
        intra = Intra.NVLINK
    else:
        intra = Intra.PCIE
    nvlink_gbps = defaults.nvlink_GBps if intra is not Intra.PCIE else 0.0
    if intra is not Intra.PCIE and nvlink_gbps <= 0:
        nvlink_gbps = 100.0
        unknown.append("nvlink_GBps")
    nvls = _truthy(labels.get(c.NODE_LABEL_NVLS))
    if nvls is None:
        nvls = defaults.nvls_capable and intra is Intra.NVSWITCH
        unknown.append("nvls")
    fabric_label = labels.get(c.NODE_LABEL_FABRIC)
    try:
        fabric = Fabric(fabric_label) if fabric_label else None
    except ValueError:
        fabric = None
    if fabric is None:
        rdma = _truthy(labels.get(c.NODE_LABEL_NFD_RDMA))
        fabric = Fabric.INFINIBAND if rdma else Fabric.ETHERNET
        unknown.append("fabric")
    gbps_label = labels.get(c.NODE_LABEL_NIC_GBPS, "")
    try:
        nic_gbps = float(gbps_label)
    except ValueError:
        nic_gbps = 0.0
    if nic_gbps <= 0:
        nic_gbps = 400.0 if fabric is Fabric.INFINIBAND else 100.0
        unknown.append("nic_Gbps")
    nics = (gpus or 8) if fabric is Fabric.INFINIBAND else 1
    unknown.append("nics_per_node")
    sharp = bool(_truthy(labels.get(c.NODE_LABEL_SHARP))) and fabric is Fabric.INFINIBAND
    if c.NODE_LABEL_SHARP not in labels:
        unknown.append("sharp")
    spec = TopologySpec(
        name=name or "node",
        gpu=model or "unknown",
        gpus_per_node=min(max(gpus or 1, 1), 72),
        nodes=1,
        intra=intra,
        nvlink_GBps=nvlink_gbps,
        nvls=bool(nvls),
        pcie_gen=defaults.pcie_gen,
        nics_per_node=nics,
        nic_Gbps=nic_gbps,
        fabric=fabric,
        sharp=sharp,
    )
    return NodeFacts(name, spec, zone, leaf, domain, tuple(unknown))
