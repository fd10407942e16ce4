"""NIC ports and the node's inter-node fabric.

Each RDMA port is a NIC: InfiniBand (link layer InfiniBand), RoCE (link layer
Ethernet), EFA (driver ``efa``). A physical Ethernet netdev whose PCI function
has no RDMA device is a plain Ethernet NIC.

The fabric is the first transport, in the order InfiniBand, EFA, RoCE,
Ethernet, that has an active port (NCCL prefers its IB/EFA network plugins
over sockets); its active ports are the fabric NICs (``fabric_member``).
For plain Ethernet only the fastest links count (a 1 GbE management port is
not a training fabric). A port whose state cannot be read makes the count
unknown rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from dynamiccl.api.node_topology import Nic, NicKind, PcieLink
from dynamiccl.api.topology import Fabric
from dynamiccl.node_agent import pci
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.netdev import ARPHRD_INFINIBAND, NetDev, NetScan
from dynamiccl.node_agent.rdma import RdmaPort, RdmaScan

ORDER: Final = (
    (NicKind.INFINIBAND, Fabric.INFINIBAND),
    (NicKind.EFA, Fabric.EFA),
    (NicKind.ROCE, Fabric.ROCE),
    (NicKind.ETHERNET, Fabric.ETHERNET),
)


@dataclass(frozen=True)
class FabricChoice:
    """The fabric and its NICs (``None`` = unknown)."""

    fabric: Fabric | None
    nics_per_node: int | None
    nic_gbps: float | None


def _kind(port: RdmaPort, dev: pci.PciDevice | None) -> NicKind:
    if port.driver == "efa" or (
        dev is not None
        and dev.vendor == pci.VENDOR_AMAZON
        and dev.device is not None
        and (dev.device >> 4) == 0xEFA
    ):
        return NicKind.EFA
    if port.link_layer == "InfiniBand":
        return NicKind.INFINIBAND
    if port.link_layer == "Ethernet":
        return NicKind.ROCE
    return NicKind.UNKNOWN


def _pci_fields(dev: pci.PciDevice | None) -> dict[str, object]:
    if dev is None:
        return {"pcie": PcieLink()}
    return {
        "vendor_id": pci.fmt_id(dev.vendor),
        "device_id": pci.fmt_id(dev.device),
        "numa_node": dev.numa_node,
        "pcie": dev.link,
    }


def _rdma_nic(port: RdmaPort, dev: pci.PciDevice | None, conds: Conditions) -> Nic:
    field = f"nics[{port.device}:{port.port}]"
    for p in port.problems:
        conds.add(f"{field}.{p.attr}", p.reason, f"{p.path}: {p.detail}")
    kind = _kind(port, dev)
    if kind is NicKind.UNKNOWN:
        conds.add(f"{field}.kind", "UnknownTransport", f"link layer {port.link_layer!r}")
    netdev = None
    if port.netdevs:
        netdev = port.netdevs[port.port - 1] if len(port.netdevs) >= port.port else port.netdevs[0]
    return Nic(
        name=port.device,
        port=port.port,
        kind=kind,
        bus_id=port.bus_id,
        driver=port.driver,
        netdev=netdev,
        state=port.state,
        phys_state=port.phys_state,
        rate_gbps=port.rate_gbps,
        **_pci_fields(dev),
    )


def _eth_nic(nd: NetDev, dev: pci.PciDevice | None, conds: Conditions) -> Nic:
    for p in nd.problems:
        conds.add(f"nics[{nd.name}].{p.attr}", p.reason, f"{p.path}: {p.detail}")
    return Nic(
        name=nd.name,
        kind=NicKind.ETHERNET if nd.is_ethernet else NicKind.UNKNOWN,
        bus_id=nd.bus_id,
        driver=nd.driver,
        netdev=nd.name,
        state=nd.operstate,
        rate_gbps=nd.speed_mbps / 1000 if nd.speed_mbps is not None else None,
        **_pci_fields(dev),
    )


def _active(nic: Nic) -> bool | None:
    return None if nic.state is None else nic.state in ("up", "ACTIVE")


def _choose(nics: list[Nic], conds: Conditions) -> tuple[FabricChoice, set[int]]:
    # Ports of unknown transport that may be up: RDMA ones could be InfiniBand or
    # RoCE, netdev ones plain Ethernet. They must not be silently left out.
    maybe = [n for n in nics if n.kind is NicKind.UNKNOWN and _active(n) is not False]
    mystery_rdma = [n.name for n in maybe if n.port is not None]
    mystery_eth = [n.name for n in maybe if n.port is None]
    for kind, fabric in ORDER:
        group = [i for i, n in enumerate(nics) if n.kind is kind]
        active = [i for i in group if _active(nics[i]) is True]
        unsure = [i for i in group if _active(nics[i]) is None]
        if not active and unsure:
            names = [nics[i].name for i in unsure]
            conds.add(
                "fabric", "UnknownState", f"{kind.value} ports with unreadable state: {names}"
            )
            return FabricChoice(None, None, None), set()
        if not active:
            continue
        if mystery_rdma and kind is not NicKind.INFINIBAND:
            conds.add("fabric", "UnknownTransport", f"RDMA ports of unknown kind: {mystery_rdma}")
            return FabricChoice(None, None, None), set()
        if kind is NicKind.ETHERNET:
            speeds = [nics[i].rate_gbps for i in active]
            if any(s is None for s in speeds):
                conds.add("nicGbps", "Unknown", "an active Ethernet port reports no speed")
                return FabricChoice(fabric, None, None), set()
            top = max(s for s in speeds if s is not None)
            active = [i for i in active if nics[i].rate_gbps == top]
        rates = [nics[i].rate_gbps for i in active]
        count: int | None = len(active)
        if unsure:
            names = [nics[i].name for i in unsure]
            conds.add("nicsPerNode", "UnknownState", f"ports with unreadable state: {names}")
            count = None
        mystery = mystery_rdma if kind is NicKind.INFINIBAND else mystery_eth
        if mystery and kind in (NicKind.INFINIBAND, NicKind.ETHERNET):
            # A port of unknown transport may belong to this fabric: do not count.
            conds.add("nicsPerNode", "UnknownTransport", f"ports of unknown kind: {mystery}")
            count = None
        gbps: float | None = None
        if any(r is None for r in rates):
            conds.add("nicGbps", "Unknown", "a fabric port's rate could not be read")
        else:
            known = [r for r in rates if r is not None]
            gbps = min(known)
            if len(set(known)) > 1:
                conds.add("nicGbps", "RatesDiffer", f"fabric ports run at {sorted(set(known))}")
        return FabricChoice(fabric, count, gbps), set(active)
    if maybe:
        conds.add("fabric", "UnknownTransport", f"ports of unknown kind: {[n.name for n in maybe]}")
        return FabricChoice(None, None, None), set()
    return FabricChoice(Fabric.NONE, 0, 0.0), set()


def build(
    scan: pci.PciScan, rdma: RdmaScan, net: NetScan, conds: Conditions
) -> tuple[list[Nic], FabricChoice]:
    """All NIC ports and the fabric choice."""
    nics: list[Nic] = []
    rdma_buses = {p.bus_id for p in rdma.ports if p.bus_id is not None}
    for port in rdma.ports:
        nics.append(_rdma_nic(port, scan.devices.get(port.bus_id or ""), conds))
    for nd in net.devices:
        if nd.bus_id is None or nd.bus_id in rdma_buses or nd.link_type == ARPHRD_INFINIBAND:
            continue
        # Physical netdevs are Ethernet (type 1); any other or unreadable type is
        # an unknown transport, kept so that it cannot silently change a count.
        nics.append(_eth_nic(nd, scan.devices.get(nd.bus_id), conds))
    if not rdma.readable and not net.readable:
        conds.add("fabric", "Missing", "neither /sys/class/infiniband nor /sys/class/net visible")
        return nics, FabricChoice(None, None, None)
    choice, members = _choose(nics, conds)
    decided = choice.fabric is not None and choice.nics_per_node is not None
    nics = [
        n.model_copy(update={"fabric_member": (i in members) if decided else None})
        for i, n in enumerate(nics)
    ]
    return nics, choice
