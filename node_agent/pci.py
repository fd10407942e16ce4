"""PCI devices from sysfs (``/sys/bus/pci/devices/*``).

Only devices that matter for communication are read in full: NVIDIA GPUs and
NVSwitches, network controllers (class 0x02), and every bridge on their path
to the CPU. The path comes from the canonical sysfs location of each device
(``/sys/devices/pci0000:15/0000:15:01.0/.../0000:18:00.0``), exactly what NCCL
walks to build its topology.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TypeVar

from dynamiccl.api.node_topology import PcieLink
from dynamiccl.node_agent import sysfs_values as sv
from dynamiccl.node_agent.hostroot import HostRoot

PCI_DEVICES: Final = "/sys/bus/pci/devices"
VENDOR_NVIDIA: Final = 0x10DE
VENDOR_MELLANOX: Final = 0x15B3
VENDOR_AMAZON: Final = 0x1D0F
VENDOR_BROADCOM: Final = 0x14E4
VENDOR_INTEL: Final = 0x8086
CLASS_BRIDGE_PCI: Final = 0x0604
CLASS_NVSWITCH: Final = 0x068000

T = TypeVar("T")


@dataclass(frozen=True)
class Problem:
    """A sysfs attribute that could not be used."""

    attr: str
    path: str
    reason: str  # Missing | Unreadable | Garbled
    detail: str


@dataclass
class PciDevice:
    """One PCI function as sysfs shows it."""

    bus_id: str
    path: str
    chain: tuple[str, ...]
    class_code: int | None = None
    vendor: int | None = None
    device: int | None = None
    subsystem_vendor: int | None = None
    subsystem_device: int | None = None
    numa_node: int | None = None
    max_speed: float | None = None
    max_width: int | None = None
    cur_speed: float | None = None
    cur_width: int | None = None
    link: PcieLink = field(default_factory=PcieLink)
    driver: str | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def is_gpu(self) -> bool:
        return (
            self.vendor == VENDOR_NVIDIA
            and self.class_code is not None
            and (self.class_code >> 8) in (0x0300, 0x0302)
        )

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == VENDOR_NVIDIA and self.class_code == CLASS_NVSWITCH

    @property
    def is_network(self) -> bool:
        return self.class_code is not None and (self.class_code >> 16) == 0x02

    @property
    def is_bridge(self) -> bool:
        return self.class_code is not None and (self.class_code >> 8) == CLASS_BRIDGE_PCI

    @property
    def parent_path(self) -> str:
        return self.path.rsplit("/", 1)[0]


@dataclass
class PciScan:
    """All PCI devices read, by normalised bus id."""

    readable: bool
    devices: dict[str, PciDevice] = field(default_factory=dict)
    # Functions whose class or vendor could not be read (any of them may be a GPU).
    unidentified: list[str] = field(default_factory=list)

    def gpus(self) -> list[PciDevice]:
        return sorted((d for d in self.devices.values() if d.is_gpu), key=lambda d: d.bus_id)

    def nvswitches(self) -> list[PciDevice]:
        return sorted((d for d in self.devices.values() if d.is_nvswitch), key=lambda d: d.bus_id)

    def by_path(self, path: str) -> PciDevice | None:
        bus = path.rsplit("/", 1)[-1]
        dev = self.devices.get(bus)
        return dev if dev is not None and dev.path == path else None


def _attr(
    host: HostRoot,
    dev: PciDevice,
    name: str,
    parse: Callable[[str], T],
    *,
    base: str | None = None,
    required: bool = True,
) -> T | None:
    path = f"{base or dev.path}/{name}"
    res = host.read(path)
    if res.text is None:
        if required:
            reason = "Missing" if res.error == "missing" else "Unreadable"
            dev.problems.append(Problem(name, path, reason, res.error or "missing"))
        return None
    try:
        return parse(res.text)
    except ValueError:
        dev.problems.append(Problem(name, path, "Garbled", res.text.strip()[:40]))
        return None


def _identify(host: HostRoot, entry: str) -> PciDevice | None:
    real = host.realpath(f"{PCI_DEVICES}/{entry}")
    if real is None or not real.startswith("/sys/devices/"):
        return None
    chain = tuple(real[len("/sys/devices/") :].split("/"))
    try:
        bus = sv.bus_id(chain[-1])
    except ValueError:
        return None
    dev = PciDevice(bus_id=bus, path=real, chain=chain)
    dev.class_code = _attr(host, dev, "class", sv.pci_class)
    dev.vendor = _attr(host, dev, "vendor", sv.hex_id)
    return dev


def _interesting(dev: PciDevice) -> bool:
    return dev.is_gpu or dev.is_nvswitch or dev.is_network or dev.class_code is None


def _fill(host: HostRoot, dev: PciDevice, parent: PciDevice | None) -> None:
    dev.device = _attr(host, dev, "device", sv.hex_id)
    dev.subsystem_vendor = _attr(host, dev, "subsystem_vendor", sv.hex_id, required=False)
    dev.subsystem_device = _attr(host, dev, "subsystem_device", sv.hex_id, required=False)
    dev.numa_node = _attr(host, dev, "numa_node", sv.numa_node, required=False)
    dev.max_speed = _attr(host, dev, "max_link_speed", sv.link_speed)
    dev.max_width = _attr(host, dev, "max_link_width", sv.link_width)
    dev.cur_speed = _attr(host, dev, "current_link_speed", sv.link_speed, required=False)
    dev.cur_width = _attr(host, dev, "current_link_width", sv.link_width, required=False)
    dev.driver = host.link_name(f"{dev.path}/driver")
    speed, width = dev.max_speed, dev.max_width
    if parent is not None:
        # NCCL: the link runs at the lower capability of the device and its port.
        # An unreadable port capability leaves the link unknown, not the device's own.
        for attr in ("max_link_speed", "max_link_width"):
            for p in parent.problems:
                if p.attr == attr:
                    dev.problems.append(
                        Problem(f"{attr} (upstream port)", p.path, p.reason, p.detail)
                    )
        speed = None if speed is None or parent.max_speed is None else min(speed, parent.max_speed)
        width = None if width is None or parent.max_width is None else min(width, parent.max_width)
    dev.link = PcieLink(
        gen=sv.pcie_gen(speed),
        speed_gts=speed,
        width=width,
        current_speed_gts=dev.cur_speed,
        current_width=dev.cur_width,
    )


def scan(host: HostRoot) -> PciScan:
    """Read the PCI devices that matter and the bridges above them."""
    entries = host.listdir(PCI_DEVICES)
    if entries is None:
        return PciScan(readable=False)
    found: dict[str, PciDevice] = {}
    unidentified: list[str] = []
    for entry in entries:
        dev = _identify(host, entry)
        if dev is None:
            unidentified.append(entry)
            continue
        found[dev.bus_id] = dev
        if dev.class_code is None or dev.vendor is None:
            unidentified.append(dev.bus_id)
    wanted: set[str] = set()
    for dev in found.values():
        if _interesting(dev):
            wanted.add(dev.bus_id)
            for comp in dev.chain[1:-1]:
                if sv.is_bus_id(comp):
                    wanted.add(sv.bus_id(comp))
    result = PciScan(readable=True, unidentified=sorted(unidentified))
    # Parents first so that a device can take min(device, port) capability.
    for bus in sorted(wanted, key=lambda b: len(found[b].chain) if b in found else 0):
        dev = found.get(bus)
        if dev is None:
            continue
        parent = result.by_path(dev.parent_path)
        _fill(host, dev, parent)
        result.devices[bus] = dev
    return result


def fmt_id(value: int | None) -> str | None:
    """``0x10de`` spelling of a PCI id."""
    return None if value is None else f"0x{value:04x}"
