"""NCCL topology XML for ``NCCL_TOPO_FILE``.

The format is the one NCCL's ``src/graph/xml.cc`` reads and dumps (version 1):
``system > cpu > pci (> pci ...) > gpu > nvlink`` and ``pci > nic > net``.
The PCI nesting follows NCCL's own rule: a device's parent is the bridge two
sysfs levels up (a PCIe switch's downstream port is folded into the switch),
and the first non-``BBBB:BB:DD.F`` component is the CPU root complex.

What we write, NCCL keeps; what we omit, NCCL fills from its own detection.
So the file carries what NCCL mis-detects in VMs and containers (PCIe tree,
NUMA placement, link speeds, NVLinks, NIC speeds) and leaves out what only
the running job knows (``dev``, ``rank``, ``gdr``, net ``dev``/``guid``).
Unknown values are omitted, never invented. GPUs and NICs the job does not
use are trimmed by NCCL, so one file serves every container on the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from dynamiccl.api.node_topology import Gpu, Nic, NicKind, NvLinkRemote
from dynamiccl.node_agent import pci
from dynamiccl.node_agent import sysfs_values as sv
from dynamiccl.node_agent.discover import Discovery

XML_VERSION: Final = "1"
NVSWITCH_CLASS: Final = "0x068000"
HIDDEN_NVSWITCH: Final = "fffffff:ffff:ff"  # NCCL's "remote not visible: assume NVSwitch"


@dataclass
class _Node:
    name: str
    attrs: list[tuple[str, str]]
    subs: list[_Node] = field(default_factory=list)

    def key(self) -> str:
        return dict(self.attrs).get("busid", dict(self.attrs).get("numaid", ""))


def _speed_text(gts: float | None) -> str | None:
    return None if gts is None else f"{gts:.1f} GT/s PCIe"


def _pci_attrs(dev: pci.PciDevice) -> list[tuple[str, str]]:
    attrs: list[tuple[str, str | None]] = [
        ("busid", dev.bus_id),
        ("class", f"0x{dev.class_code:06x}" if dev.class_code is not None else None),
        ("vendor", pci.fmt_id(dev.vendor)),
        ("device", pci.fmt_id(dev.device)),
        ("subsystem_vendor", pci.fmt_id(dev.subsystem_vendor)),
        ("subsystem_device", pci.fmt_id(dev.subsystem_device)),
        ("link_speed", _speed_text(dev.link.speed_gts)),
        ("link_width", str(dev.link.width) if dev.link.width is not None else None),
    ]
    return [(k, v) for k, v in attrs if v is not None]


class _Builder:
    def __init__(self, disc: Discovery) -> None:
        self.disc = disc
        self.cpus: dict[str, _Node] = {}
        self.pcis: dict[str, _Node] = {}

    def _cpu(self, numa: str) -> _Node:
        if numa not in self.cpus:
            cpu = self.disc.topology.cpu
            attrs: list[tuple[str, str]] = [("numaid", numa)]
            cpumap = self.disc.cpu.cpumaps.get(int(numa)) if numa != "-1" else None
            if cpumap:
                attrs.append(("affinity", cpumap))
            if cpu.arch:
                attrs.append(("arch", cpu.arch))
            if cpu.arch == "x86_64" and cpu.vendor:
                attrs.append(("vendor", cpu.vendor))
                if cpu.family is not None and cpu.model is not None:
                    attrs += [("familyid", str(cpu.family)), ("modelid", str(cpu.model))]
            self.cpus[numa] = _Node("cpu", attrs)
        return self.cpus[numa]

    def pci_node(self, dev: pci.PciDevice) -> _Node | None:
        """The <pci> node of ``dev``, created with its NCCL parents on first use."""
        if dev.bus_id in self.pcis:
            return self.pcis[dev.bus_id]
        chain = dev.chain
        n = len(chain) - 1
        parent: _Node | None = None
        for j in range(n - 1, -1, -1):
            if not sv.is_bus_id(chain[j]):
                numa = str(dev.numa_node) if dev.numa_node is not None else "-1"
                parent = self._cpu(numa)
                break
            if n - j == 2:
                upper = self.disc.pci.devices.get(sv.bus_id(chain[j]))
                parent = self.pci_node(upper) if upper is not None else None
                break
        if parent is None:
            return None
        node = _Node("pci", _pci_attrs(dev))
        parent.subs.append(node)
        self.pcis[dev.bus_id] = node
        return node

    def gpu(self, g: Gpu) -> None:
        dev = self.disc.pci.devices.get(g.bus_id)
        node = self.pci_node(dev) if dev is not None else None
        if node is None or g.compute_capability is None:
            return
        major, minor = g.compute_capability.split(".")
        gnode = _Node("gpu", [("sm", str(int(major) * 10 + int(minor)))])
        if g.nvlink_links is not None and all(
            p.remote is not NvLinkRemote.UNKNOWN for p in g.nvlink_peers
        ):
            for p in g.nvlink_peers:
                target = p.remote_bus_id or HIDDEN_NVSWITCH
                tclass = NVSWITCH_CLASS
                if p.remote is NvLinkRemote.GPU:
                    peer = self.disc.pci.devices.get(target)
                    if peer is None or peer.class_code is None:
                        continue
                    tclass = f"0x{peer.class_code:06x}"
                gnode.subs.append(
                    _Node(
                        "nvlink", [("target", target), ("count", str(p.links)), ("tclass", tclass)]
                    )
                )
        node.subs.append(gnode)

    def nic(self, n: Nic) -> None:
        dev = self.disc.pci.devices.get(n.bus_id or "")
        node = self.pci_node(dev) if dev is not None else None
        if node is None:
            return
        nic = next((s for s in node.subs if s.name == "nic"), None)
        if nic is None:
            nic = _Node("nic", [])
            node.subs.append(nic)
        if any(dict(s.attrs).get("name") == n.name for s in nic.subs):
            return  # one <net> per device name (NCCL looks nets up by name)
        attrs = [("name", n.name)]
        if n.port is not None:
            attrs.append(("port", str(n.port)))
        if n.rate_gbps is not None:
            attrs.append(("speed", str(round(n.rate_gbps * 1000))))
        nic.subs.append(_Node("net", attrs))


def _sort(node: _Node) -> None:
    node.subs.sort(key=lambda s: (s.name not in {"gpu", "nic"}, s.key()))
    for s in node.subs:
        _sort(s)


def _dump(node: _Node, indent: int, out: list[str]) -> None:
    attrs = "".join(f' {k}="{v}"' for k, v in node.attrs)
    pad = " " * indent
    if not node.subs:
        out.append(f"{pad}<{node.name}{attrs}/>")
        return
    out.append(f"{pad}<{node.name}{attrs}>")
    for s in node.subs:
        _dump(s, indent + 2, out)
    out.append(f"{pad}</{node.name}>")


def render(disc: Discovery, *, named: bool = True) -> str:
    """The node's topology as NCCL topology XML (NCCL's own dump layout).

    ``named=False`` leaves the node's name out (NCCL only logs it), so that nodes of one
    layout have byte-identical files that a job's ConfigMap holds once."""
    b = _Builder(disc)
    topo = disc.topology
    for g in topo.gpus:
        b.gpu(g)
    for n in topo.nics:
        if n.kind is not NicKind.ETHERNET or n.fabric_member:
            b.nic(n)
    attrs = [("version", XML_VERSION)] + ([("name", topo.node_name)] if named else [])
    system = _Node("system", attrs)
    system.subs = [b.cpus[k] for k in sorted(b.cpus, key=int)]
    for cpu in system.subs:
        _sort(cpu)
    out: list[str] = []
    _dump(system, 0, out)
    return "\n".join(out) + "\n"
