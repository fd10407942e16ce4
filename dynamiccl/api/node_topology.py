"""NodeTopology: what the node agent discovered about one node (issue #3).

The same model is printed by ``dynamiccl discover --json`` and published as the
``status`` of a cluster-scoped ``NodeTopology`` custom resource named after the
node. Wire names are camelCase (Kubernetes convention); the embedded ``spec``
is the topology spec (docs/simulator.md, 'The topology spec') and keeps its contract spelling.

Every fact is optional: ``None`` means *unknown*, and an entry in
``conditions`` names the unknown and why. Discovery never fills a gap with a
guess.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from dynamiccl.api.topology import Fabric, Intra, TopologySpec
from dynamiccl.constants import API_VERSION, GROUP, LABEL_MANAGED_BY

KIND: Final = "NodeTopology"
PLURAL: Final = "nodetopologies"
SINGULAR: Final = "nodetopology"
SHORT_NAMES: Final = ("ntopo",)

BusId = Annotated[str, Field(pattern=r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")]


class _Wire(BaseModel):
    """camelCase on the wire, snake_case in Python, immutable, unknown keys rejected."""

    model_config: ClassVar[ConfigDict] = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class Source(StrEnum):
    """Where a fact came from."""

    SYSFS = "sysfs"
    PROCFS = "procfs"
    NVML = "nvml"
    NVIDIA_SMI = "nvidia-smi"
    OVERRIDE = "override"


class NicKind(StrEnum):
    """Transport of one NIC port."""

    INFINIBAND = "infiniband"
    ROCE = "roce"
    EFA = "efa"
    ETHERNET = "ethernet"
    UNKNOWN = "unknown"


class NvLinkRemote(StrEnum):
    """What sits at the far end of an NVLink."""

    GPU = "gpu"
    NVSWITCH = "nvswitch"
    UNKNOWN = "unknown"


class ShmSharing(StrEnum):
    """Who shares the /dev/shm this process sees."""

    HOST = "host"
    POD = "pod"
    CONTAINER = "container"
    UNKNOWN = "unknown"


class TopologyCondition(_Wire):
    """One thing discovery could not establish (or a degraded source), named."""

    field: str = Field(description="what is unknown, e.g. gpus[0000:18:00.0].pcie or nvml")
    reason: str = Field(description="CamelCase reason, e.g. Missing, Garbled, NvmlError")
    message: str


class PcieLink(_Wire):
    """A PCIe link: capability (min of device and upstream port, as NCCL reads it)."""

    gen: int | None = None
    speed_gts: float | None = None
    width: int | None = None
    current_speed_gts: float | None = None
    current_width: int | None = None


class NvLinkPeer(_Wire):
    """Active NVLinks from one GPU to one remote device."""

    remote: NvLinkRemote
    remote_bus_id: BusId | None = None
    links: int = Field(ge=1)


class GpuFabric(_Wire):
    """NVLink fabric membership (multi-node NVLink, e.g. GB200 NVL72)."""

    cluster_uuid: str | None = None
    clique_id: int | None = None
    state: str | None = None


class Gpu(_Wire):
    """One GPU of the node."""

    bus_id: BusId
    index: int | None = Field(default=None, description="NVML index in this container's view")
    visible: bool | None = Field(default=None, description="usable by this container")
    model: str | None = Field(default=None, description="short model as in the spec: H100")
    product: str | None = Field(default=None, description="full name: NVIDIA H100 80GB HBM3")
    architecture: str | None = None
    compute_capability: str | None = None
    vendor_id: str | None = None
    device_id: str | None = None
    numa_node: int | None = None
    pcie: PcieLink = PcieLink()
    nvlink_links: int | None = Field(default=None, description="active NVLinks")
    nvlink_gbps: float | None = Field(default=None, description="unidirectional GB/s")
    nvlink_peers: list[NvLinkPeer] = []
    mig_enabled: bool | None = None
    fabric: GpuFabric | None = None


class Nic(_Wire):
    """One NIC port (an RDMA device port, or an Ethernet netdev without RDMA)."""

    name: str = Field(description="RDMA device (mlx5_0, rdmap79s0) or netdev name")
    port: int | None = None
    kind: NicKind
    bus_id: BusId | None = None
    vendor_id: str | None = None
    device_id: str | None = None
    driver: str | None = None
    netdev: str | None = None
    state: str | None = None
    phys_state: str | None = None
    rate_gbps: float | None = None
    numa_node: int | None = None
    pcie: PcieLink = PcieLink()
    fabric_member: bool | None = Field(default=None, description="counted in nics_per_node")


class NvSwitch(_Wire):
    """An NVSwitch visible on PCI (HGX baseboards expose them; VMs often do not)."""

    bus_id: BusId
    device_id: str | None = None


class NvLinkMatrix(_Wire):
    """NVLinks between each pair of visible GPUs (through a switch: the pair's bottleneck)."""

    gpus: list[BusId] = []
    links: list[list[int]] = []


class NumaNode(_Wire):
    """One NUMA node."""

    id: int
    cpus: str | None = Field(default=None, description="cpulist, e.g. 0-55,112-167")


class Cpu(_Wire):
    """Host CPU and NUMA layout."""

    arch: str | None = None
    vendor: str | None = None
    model_name: str | None = None
    family: int | None = None
    model: int | None = None
    numa_nodes: list[NumaNode] = []


class Sharp(_Wire):
    """In-network aggregation (IB SHARP / NCCL CollNet)."""

    capable: bool | None = None
    basis: str = ""
    evidence: list[str] = []
    override: bool | None = None


class Gdr(_Wire):
    """GPUDirect RDMA through a peer-memory kernel module."""

    enabled: bool | None = None
    modules: list[str] = []


class DevShm(_Wire):
    """The /dev/shm this process sees."""

    sharing: ShmSharing = ShmSharing.UNKNOWN
    size_bytes: int | None = None


class Container(_Wire):
    """The container boundary around the process that ran discovery."""

    in_container: bool | None = None
    runtime: str | None = None
    orchestrator: str | None = None
    cgroup_version: int | None = None
    ipc_host: bool | None = Field(default=None, description="shares the host IPC namespace")
    pid_host: bool | None = None
    dev_shm: DevShm = DevShm()
    gpus_visible: int | None = None
    gpus_on_node: int | None = None
    boundary: bool | None = Field(default=None, description="sees fewer GPUs than the node has")


MAX_NCCL_TOPO_XML: Final = 128 * 1024  # bytes: an 8-GPU, 32-NIC node's file is ~12 KiB


class NcclTopoFile(_Wire):
    """NCCL's topology XML for this node (``NCCL_TOPO_FILE``), written by its node agent."""

    reason: str = Field(max_length=1024, description="why the node has one (facts or 'always')")
    xml: str = Field(max_length=MAX_NCCL_TOPO_XML, description="the file, NCCL's XML version 1")


class NodeTopology(_Wire):
    """Everything discovered about one node; the status of the NodeTopology CR."""

    node_name: str
    gpus: list[Gpu] = []
    nics: list[Nic] = []
    nvswitches: list[NvSwitch] = []
    nvlink_matrix: NvLinkMatrix = NvLinkMatrix()
    intra: Intra | None = None
    nvlink_gbps: float | None = Field(default=None, description="per visible GPU, GB/s one way")
    nvswitch: bool | None = None
    nvls: bool | None = None
    fabric: Fabric | None = None
    nics_per_node: int | None = None
    nic_gbps: float | None = None
    pcie_gen: int | None = None
    sharp: Sharp = Sharp()
    gdr: Gdr = Gdr()
    cpu: Cpu = Cpu()
    container: Container = Container()
    driver_version: str | None = None
    sources: list[Source] = []
    recorded: bool = Field(default=False, description="NVML/nvidia-smi answers were recordings")
    spec: TopologySpec | None = Field(
        default=None, description="the topology spec (docs/simulator.md)"
    )
    spec_unknown: list[str] = Field(default=[], description="spec keys discovery could not set")
    conditions: list[TopologyCondition] = []
    nccl_topo_file: NcclTopoFile | None = Field(
        default=None, description="NCCL topology XML the webhook points the node's pods at"
    )

    def wire(self) -> dict[str, Any]:
        """The JSON-ready dict (camelCase keys; spec keeps its contract keys)."""
        return self.model_dump(mode="json", by_alias=True)


class NodeTopologySpec(_Wire):
    """The CR's spec: only which node it describes (the agent writes, nobody edits)."""

    node_name: str


def api_version() -> str:
    """`apiVersion` of NodeTopology objects."""
    return f"{GROUP}/{API_VERSION}"


def custom_resource(node_name: str, status: NodeTopology | None = None) -> dict[str, Any]:
    """The NodeTopology object for one node (cluster-scoped, name = node name)."""
    body: dict[str, Any] = {
        "apiVersion": api_version(),
        "kind": KIND,
        "metadata": {"name": node_name, "labels": {LABEL_MANAGED_BY: "dynamiccl"}},
        "spec": NodeTopologySpec(node_name=node_name).model_dump(mode="json", by_alias=True),
    }
    if status is not None:
        body["status"] = status.wire()
    return body
