"""RDMA devices and their ports from ``/sys/class/infiniband``.

Covers InfiniBand HCAs, RoCE (an RDMA port whose link layer is Ethernet) and
AWS EFA (driver ``efa``, link layer ``Unknown``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TypeVar

from dynamiccl.node_agent import sysfs_values as sv
from dynamiccl.node_agent.hostroot import HostRoot
from dynamiccl.node_agent.pci import Problem

IB_CLASS: Final = "/sys/class/infiniband"
STATE_ACTIVE: Final = 4

T = TypeVar("T")


@dataclass
class RdmaPort:
    """One port of one RDMA device."""

    device: str
    port: int
    bus_id: str | None = None
    driver: str | None = None
    node_type: str | None = None
    link_layer: str | None = None
    state: str | None = None
    state_code: int | None = None
    phys_state: str | None = None
    rate_gbps: float | None = None
    netdevs: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def active(self) -> bool | None:
        return None if self.state_code is None else self.state_code == STATE_ACTIVE


@dataclass
class RdmaScan:
    """All RDMA ports; ``readable`` is False when sysfs itself is not visible."""

    readable: bool
    ports: list[RdmaPort] = field(default_factory=list)


def _read(
    host: HostRoot, port: RdmaPort, path: str, attr: str, parse: Callable[[str], T]
) -> T | None:
    res = host.read(path)
    if res.text is None:
        reason = "Missing" if res.error == "missing" else "Unreadable"
        port.problems.append(Problem(attr, path, reason, res.error or "missing"))
        return None
    try:
        return parse(res.text)
    except ValueError:
        port.problems.append(Problem(attr, path, "Garbled", res.text.strip()[:40]))
        return None


def _node_type(text: str) -> str:
    m = re.fullmatch(r"[0-9]{1,3}: ([A-Za-z][A-Za-z <>]{0,20})", text.strip())
    if m is None:
        raise ValueError(f"not a node type: {text[:40]!r}")
    return m.group(1)


def _device_ports(host: HostRoot, name: str) -> list[RdmaPort]:
    base = f"{IB_CLASS}/{name}"
    pci_path = host.realpath(f"{base}/device")
    bus_id: str | None = None
    driver: str | None = None
    netdevs: list[str] = []
    if pci_path is not None:
        try:
            bus_id = sv.bus_id(pci_path.rsplit("/", 1)[-1])
        except ValueError:
            bus_id = None
        driver = host.link_name(f"{pci_path}/driver")
        netdevs = host.listdir(f"{pci_path}/net") or []
    port_names = host.listdir(f"{base}/ports")
    if not port_names:
        broken = RdmaPort(device=name, port=0, bus_id=bus_id, driver=driver, netdevs=netdevs)
        broken.problems.append(Problem("ports", f"{base}/ports", "Missing", "no ports listed"))
        return [broken]
    result: list[RdmaPort] = []
    node_type_text = host.read_text(f"{base}/node_type")
    for pname in port_names:
        if not pname.isdigit():
            continue
        port = RdmaPort(device=name, port=int(pname), bus_id=bus_id, driver=driver)
        port.netdevs = list(netdevs)
        if node_type_text is not None:
            try:
                port.node_type = _node_type(node_type_text)
            except ValueError:
                port.node_type = None
        pdir = f"{base}/ports/{pname}"
        port.link_layer = _read(host, port, f"{pdir}/link_layer", "link_layer", sv.link_layer)
        state = _read(host, port, f"{pdir}/state", "state", sv.ib_state)
        if state is not None:
            port.state_code, port.state = state
        phys = _read(host, port, f"{pdir}/phys_state", "phys_state", sv.ib_phys_state)
        if phys is not None:
            port.phys_state = phys[1]
        port.rate_gbps = _read(host, port, f"{pdir}/rate", "rate", sv.ib_rate)
        result.append(port)
    return result


def scan(host: HostRoot) -> RdmaScan:
    """Every RDMA port. No ``/sys/class/infiniband`` = no RDMA stack = no ports."""
    if not host.is_dir("/sys/class"):
        return RdmaScan(readable=False)
    names = host.listdir(IB_CLASS)
    out = RdmaScan(readable=True)
    for name in names or []:
        out.ports.extend(_device_ports(host, name))
    return out
