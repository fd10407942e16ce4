"""A topology spec resolved against the GPU catalog: the numbers every model uses.

Extra optional spec keys understood here (docs/simulator.md, 'The topology spec', allows them):

- `container_gpus` (int): GPUs per container when a node is split into several
  containers. Across a container boundary NCCL loses P2P and SHM, each
  container becomes a separate NCCL "node" and traffic between containers goes
  through the host (S. Lee, J. Lee, Appl. Sci. 2024, 14, 5100, doi:10.3390/app14125100, §7.3:
  +50-213 % latency across Docker boundaries). Must divide `gpus_per_node`.
- `cpu_vendor` (`intel` | `amd` | `arm`): NCCL's multi-node LL bandwidth cap and
  network post overhead depend on it (`llMaxBws`, `getNetOverhead` in
  `src/graph/tuning.cc`). Default `intel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from dynamiccl.api.topology import Fabric, Intra, TopologySpec, parse_topology
from dynamiccl.policy.sim.hardware import (
    GpuSpec,
    HardwareError,
    gpu_spec,
    nccl_pcie_GBps,
    pcie_GBps,
)

CpuVendor = Literal["intel", "amd", "arm"]


@dataclass(frozen=True)
class System:
    """Everything the NCCL model and the simulator derive from one topology."""

    spec: TopologySpec
    gpu: GpuSpec
    cpu_vendor: CpuVendor
    # NCCL's view: a container is a node when the node is split.
    nodes: int  # NCCL nNodes
    local_ranks: int  # ranks per NCCL node
    containers_per_node: int  # 1 when not split
    # Physical per-GPU bandwidths (GB/s, unidirectional).
    intra_GBps: float  # noqa: N815 - NVLink per GPU, or PCIe when intra: pcie
    pcie_GBps: float  # noqa: N815
    net_node_GBps: float  # noqa: N815 - sum of the node's NICs
    nics: int

    @property
    def ranks(self) -> int:
        """Total ranks (GPUs) of the communicator."""
        return self.nodes * self.local_ranks

    @property
    def physical_nodes(self) -> int:
        """Machines (not containers)."""
        return self.spec.nodes

    @property
    def nvlink(self) -> bool:
        """GPUs of one NCCL node talk over NVLink."""
        return self.spec.intra is not Intra.PCIE

    @property
    def nvswitch(self) -> bool:
        """An NVSwitch connects the GPUs of a node."""
        return self.spec.intra is Intra.NVSWITCH

    @property
    def container_split(self) -> bool:
        """The node is split into several containers."""
        return self.containers_per_node > 1

    @property
    def fabric(self) -> Fabric:
        """Inter-node fabric."""
        return self.spec.fabric

    @property
    def nccl_intra_GBps(self) -> float:  # noqa: N802
        """Per-GPU intra-node bandwidth as NCCL's topology search counts it."""
        if self.nvlink:
            links = round(self.intra_GBps / self.gpu.nvlink_link_GBps)
            return max(1, links) * self.gpu.nccl_nvlink_link_GBps
        return nccl_pcie_GBps(self.spec.pcie_gen)

    @property
    def nccl_pcie_GBps(self) -> float:  # noqa: N802
        """PCIe as NCCL counts it."""
        return nccl_pcie_GBps(self.spec.pcie_gen)


def derive_spec(base: TopologySpec, **changes: Any) -> TopologySpec:
    """`base` with some keys changed (extra keys allowed), validated again."""
    return parse_topology(base.model_dump(mode="json") | changes, source=base.name)


def _extra(spec: TopologySpec, key: str) -> object:
    extra = spec.model_extra or {}
    return extra.get(key)


def resolve(spec: TopologySpec) -> System:
    """Resolve `spec`; HardwareError names the offending field."""
    gpu = gpu_spec(spec.gpu)
    if spec.intra is not Intra.PCIE and gpu.nvlink_links == 0:
        raise HardwareError(
            f"intra: {spec.intra.value} but gpu {gpu.name} has no NVLink (use intra: pcie)"
        )
    if spec.intra is not Intra.PCIE and spec.nvlink_GBps > gpu.nvlink_GBps * 1.05:
        raise HardwareError(
            f"nvlink_GBps: {spec.nvlink_GBps:g} exceeds {gpu.name}'s {gpu.nvlink_GBps:g} GB/s "
            f"per direction ({gpu.nvlink_links} NVLink{gpu.nvlink_gen} links); "
            "give the unidirectional per-GPU figure"
        )
    if spec.nvls and not gpu.nvls_capable:
        raise HardwareError(f"nvls: true but gpu {gpu.name} has no NVLink SHARP (Hopper or newer)")
    vendor_raw = _extra(spec, "cpu_vendor") or "intel"
    if vendor_raw not in ("intel", "amd", "arm"):
        raise HardwareError(f"cpu_vendor: {vendor_raw!r} is not one of intel, amd, arm")
    vendor: CpuVendor = vendor_raw
    per_container = _extra(spec, "container_gpus")
    if per_container is None:
        per_container = spec.gpus_per_node
    if isinstance(per_container, bool) or not isinstance(per_container, int):
        raise HardwareError(f"container_gpus: expected an integer, got {per_container!r}")
    if not 1 <= per_container <= spec.gpus_per_node or spec.gpus_per_node % per_container:
        raise HardwareError(
            f"container_gpus: {per_container} must divide gpus_per_node ({spec.gpus_per_node})"
        )
    containers = spec.gpus_per_node // per_container
    intra = spec.nvlink_GBps if spec.intra is not Intra.PCIE else pcie_GBps(spec.pcie_gen)
    nics = spec.nics_per_node if spec.fabric is not Fabric.NONE else 0
    return System(
        spec=spec,
        gpu=gpu,
        cpu_vendor=vendor,
        nodes=spec.nodes * containers,
        local_ranks=per_container,
        containers_per_node=containers,
        intra_GBps=intra,
        pcie_GBps=pcie_GBps(spec.pcie_gen),
        net_node_GBps=nics * spec.nic_Gbps / 8.0,
        nics=nics,
    )
