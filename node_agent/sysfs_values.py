"""Parsers for values as the Linux kernel prints them in sysfs/procfs.

Each parser accepts exactly the kernel's format and raises ``ValueError`` on
anything else (a truncated or garbled file), so a bad file becomes a named
unknown instead of a wrong value. The kernel ends every value with a newline;
a value without one was cut short (``100`` may be the start of ``100000``) and
is rejected too. ``None`` means the kernel itself said
"unknown" (e.g. ``numa_node`` = -1, link speed ``Unknown``).
"""

from __future__ import annotations

import re
from typing import Final

_HEX4 = re.compile(r"0x[0-9a-fA-F]{4}")
_HEX6 = re.compile(r"0x[0-9a-fA-F]{6}")
_INT = re.compile(r"-?[0-9]{1,12}")
_SPEED = re.compile(r"([0-9]{1,3}(?:\.[0-9]{1,3})?) GT/s(?: PCIe)?")
_RATE = re.compile(r"([0-9]{1,5})(\.5)? Gb/sec \(([0-9]{1,2})X ([A-Z0-9]{3,5})\)")
_STATE = re.compile(r"([0-9]{1,2}): ([A-Za-z][A-Za-z_ ]{0,30})")
_CPULIST = re.compile(r"(?:[0-9]{1,5}(?:-[0-9]{1,5})?(?:,[0-9]{1,5}(?:-[0-9]{1,5})?)*)?")
_CPUMAP = re.compile(r"[0-9a-f]{1,8}(?:,[0-9a-f]{8})*")
_GUID = re.compile(r"[0-9a-f]{4}(?::[0-9a-f]{4}){3}")
_BDF = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")

# PCIe transfer rate (GT/s) -> generation
PCIE_GEN: Final[dict[float, int]] = {
    2.5: 1,
    5.0: 2,
    8.0: 3,
    16.0: 4,
    32.0: 5,
    64.0: 6,
    128.0: 7,
}
LINK_LAYERS: Final = frozenset({"InfiniBand", "Ethernet", "Unknown"})
LINK_WIDTHS: Final = frozenset({1, 2, 4, 8, 12, 16, 32})
# Per-lane Gb/s the kernel multiplies by the port width (drivers/infiniband/core/sysfs.c).
IB_LANE_GBPS: Final = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}
IB_WIDTHS: Final = frozenset({1, 2, 4, 8, 12})
PORT_STATES: Final = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES: Final = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
# ethtool SPEED_* values (Mb/s) drivers report.
ETH_SPEEDS: Final = frozenset(
    {
        10,
        100,
        1000,
        2500,
        5000,
        10000,
        14000,
        20000,
        25000,
        40000,
        50000,
        56000,
        100000,
        200000,
        400000,
        800000,
        1600000,
    }
)
OPERSTATES: Final = frozenset(
    {"up", "down", "unknown", "dormant", "lowerlayerdown", "notpresent", "testing"}
)


def _clean(text: str) -> str:
    if not text.endswith("\n"):
        raise ValueError(f"truncated (no trailing newline): {text[:40]!r}")
    return text[:-1].strip()


def _full(pattern: re.Pattern[str], text: str, what: str) -> re.Match[str]:
    m = pattern.fullmatch(_clean(text))
    if m is None:
        raise ValueError(f"not a {what}: {text[:40]!r}")
    return m


def hex_id(text: str) -> int:
    """A 16-bit PCI id such as ``0x10de``."""
    return int(_full(_HEX4, text, "PCI id").group(0), 16)


def pci_class(text: str) -> int:
    """A 24-bit PCI class such as ``0x030200``."""
    return int(_full(_HEX6, text, "PCI class").group(0), 16)


def integer(text: str) -> int:
    """A decimal integer."""
    return int(_full(_INT, text, "integer").group(0))


def numa_node(text: str) -> int | None:
    """``numa_node``: -1 means the kernel knows no affinity."""
    value = integer(text)
    if value < -1:
        raise ValueError(f"not a NUMA node: {text[:40]!r}")
    return None if value == -1 else value


def link_speed(text: str) -> float | None:
    """``max_link_speed``/``current_link_speed``: GT/s, ``None`` for ``Unknown``."""
    if _clean(text) in ("Unknown", "Unknown speed"):
        return None
    value = float(_full(_SPEED, text, "PCIe link speed").group(1))
    if value not in PCIE_GEN:
        raise ValueError(f"not a PCIe transfer rate: {text[:40]!r}")
    return value


def link_width(text: str) -> int | None:
    """``max_link_width``/``current_link_width``: lanes, ``None`` for 0 (unknown)."""
    value = integer(text)
    if value != 0 and value not in LINK_WIDTHS:
        raise ValueError(f"not a PCIe link width: {text[:40]!r}")
    return value or None


def pcie_gen(speed_gts: float | None) -> int | None:
    """PCIe generation of a transfer rate."""
    return None if speed_gts is None else PCIE_GEN.get(speed_gts)


def ib_rate(text: str) -> float:
    """InfiniBand port ``rate`` (``400 Gb/sec (4X NDR)``) in Gb/s."""
    m = _full(_RATE, text, "port rate")
    rate = int(m.group(1)) + (0.5 if m.group(2) else 0.0)
    width, lane = int(m.group(3)), IB_LANE_GBPS.get(m.group(4))
    # The kernel prints width x lane rate; anything else is not its output.
    if lane is None or width not in IB_WIDTHS or abs(rate - int(width * lane * 2) / 2) > 0.01:
        raise ValueError(f"inconsistent port rate: {text[:40]!r}")
    return rate


def _state(text: str, table: dict[int, str], what: str) -> tuple[int, str]:
    m = _full(_STATE, text, what)
    code, name = int(m.group(1)), m.group(2).strip()
    if table.get(code) != name:
        raise ValueError(f"not a {what}: {text[:40]!r}")
    return code, name


def ib_state(text: str) -> tuple[int, str]:
    """Port ``state`` (``4: ACTIVE``)."""
    return _state(text, PORT_STATES, "port state")


def ib_phys_state(text: str) -> tuple[int, str]:
    """Port ``phys_state`` (``5: LinkUp``)."""
    return _state(text, PHYS_STATES, "port physical state")


def link_layer(text: str) -> str:
    """Port ``link_layer``: InfiniBand, Ethernet or Unknown."""
    value = _clean(text)
    if value not in LINK_LAYERS:
        raise ValueError(f"not a link layer: {text[:40]!r}")
    return value


def cpulist(text: str) -> str:
    """A cpulist (``0-55,112-167``); empty for memory-only nodes."""
    return _full(_CPULIST, text, "cpulist").group(0)


def cpumap(text: str) -> str:
    """A cpumap mask (``ffffffff,00000000``)."""
    return _full(_CPUMAP, text, "cpumap").group(0)


def netdev_speed(text: str) -> int | None:
    """``/sys/class/net/X/speed`` in Mb/s; ``None`` when the kernel reports unknown."""
    value = integer(text)
    if value in (-1, 0, 4294967295):
        return None
    if value not in ETH_SPEEDS:
        raise ValueError(f"not a link speed: {text[:40]!r}")
    return value


def operstate(text: str) -> str:
    """``/sys/class/net/X/operstate``."""
    value = _clean(text)
    if value not in OPERSTATES:
        raise ValueError(f"not an operstate: {text[:40]!r}")
    return value


def node_guid(text: str) -> str:
    """An RDMA ``node_guid`` (``b83f:d203:00a1:2c3e``)."""
    return _full(_GUID, text, "node GUID").group(0)


def bus_id(text: str) -> str:
    """Normalise a PCI bus id to NCCL's spelling: lower case, 4-digit domain.

    Accepts NVML's ``00000000:18:00.0`` and sysfs's ``0000:18:00.0``.
    """
    m = _BDF.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a PCI bus id: {text[:40]!r}")
    domain = int(m.group(1), 16)
    if domain > 0xFFFF:
        raise ValueError(f"PCI domain out of range: {text[:40]!r}")
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def is_bus_id(text: str) -> bool:
    """Whether a path component looks like ``BBBB:BB:DD.F`` (NCCL's checkBDFFormat)."""
    return _BDF.fullmatch(text) is not None and len(text) == 12
