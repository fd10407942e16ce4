"""Network interfaces from ``/sys/class/net`` (physical ones only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from dynamiccl.node_agent import sysfs_values as sv
from dynamiccl.node_agent.hostroot import HostRoot
from dynamiccl.node_agent.pci import Problem

NET_CLASS: Final = "/sys/class/net"
ARPHRD_ETHER: Final = 1
ARPHRD_INFINIBAND: Final = 32


@dataclass
class NetDev:
    """A netdev backed by a PCI function."""

    name: str
    bus_id: str | None
    driver: str | None = None
    link_type: int | None = None
    operstate: str | None = None
    speed_mbps: int | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def is_ethernet(self) -> bool:
        return self.link_type == ARPHRD_ETHER


@dataclass
class NetScan:
    """Physical netdevs; ``readable`` is False when /sys/class/net is not visible."""

    readable: bool
    devices: list[NetDev] = field(default_factory=list)


def _one(host: HostRoot, name: str) -> NetDev | None:
    real = host.realpath(f"{NET_CLASS}/{name}")
    if real is None or real.startswith("/sys/devices/virtual/"):
        return None
    pci_path = host.realpath(f"{NET_CLASS}/{name}/device")
    if pci_path is None:
        return None
    try:
        bus: str | None = sv.bus_id(pci_path.rsplit("/", 1)[-1])
    except ValueError:
        bus = None  # not a PCI device (e.g. a USB NIC)
    dev = NetDev(name=name, bus_id=bus, driver=host.link_name(f"{pci_path}/driver"))
    base = f"{NET_CLASS}/{name}"
    for attr in ("type", "operstate", "speed"):
        path = f"{base}/{attr}"
        res = host.read(path)
        if res.text is None:
            # The kernel refuses to report speed on a link that is down: not a problem.
            if not (attr == "speed" and dev.operstate != "up"):
                reason = "Missing" if res.error == "missing" else "Unreadable"
                dev.problems.append(Problem(attr, path, reason, res.error or "missing"))
            continue
        try:
            if attr == "type":
                dev.link_type = sv.integer(res.text)
            elif attr == "operstate":
                dev.operstate = sv.operstate(res.text)
            else:
                dev.speed_mbps = sv.netdev_speed(res.text)
        except ValueError:
            dev.problems.append(Problem(attr, path, "Garbled", res.text.strip()[:40]))
    return dev


def scan(host: HostRoot) -> NetScan:
    """Every physical netdev."""
    names = host.listdir(NET_CLASS)
    if names is None:
        return NetScan(readable=False)
    out = NetScan(readable=True)
    for name in names:
        dev = _one(host, name)
        if dev is not None:
            out.devices.append(dev)
    return out
