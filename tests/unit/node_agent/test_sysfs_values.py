"""Kernel-format parsers: exact formats accepted, everything else rejected (fuzzed)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.node_agent import sysfs_values as sv

PARSERS: list[Callable[[str], Any]] = [
    sv.hex_id,
    sv.pci_class,
    sv.integer,
    sv.numa_node,
    sv.link_speed,
    sv.link_width,
    sv.ib_rate,
    sv.ib_state,
    sv.ib_phys_state,
    sv.link_layer,
    sv.cpulist,
    sv.cpumap,
    sv.netdev_speed,
    sv.operstate,
    sv.node_guid,
    sv.bus_id,
]


@pytest.mark.parametrize(
    ("parser", "text", "value"),
    [
        (sv.hex_id, "0x10de\n", 0x10DE),
        (sv.pci_class, "0x030200\n", 0x030200),
        (sv.numa_node, "-1\n", None),
        (sv.numa_node, "3\n", 3),
        (sv.link_speed, "32.0 GT/s PCIe\n", 32.0),
        (sv.link_speed, "8 GT/s\n", 8.0),  # kernels before 5.7
        (sv.link_speed, "2.5 GT/s PCIe\n", 2.5),
        (sv.link_speed, "Unknown\n", None),
        (sv.link_width, "16\n", 16),
        (sv.link_width, "0\n", None),
        (sv.ib_rate, "400 Gb/sec (4X NDR)\n", 400.0),
        (sv.ib_rate, "56 Gb/sec (4X FDR)\n", 56.0),
        (sv.ib_rate, "2.5 Gb/sec (1X SDR)\n", 2.5),
        (sv.ib_rate, "800 Gb/sec (4X XDR)\n", 800.0),
        (sv.ib_state, "4: ACTIVE\n", (4, "ACTIVE")),
        (sv.ib_phys_state, "5: LinkUp\n", (5, "LinkUp")),
        (sv.link_layer, "InfiniBand\n", "InfiniBand"),
        (sv.cpulist, "0-55,112-167\n", "0-55,112-167"),
        (sv.cpulist, "\n", ""),
        (sv.cpumap, "3\n", "3"),
        (sv.cpumap, "ffffffff,00000000\n", "ffffffff,00000000"),
        (sv.netdev_speed, "100000\n", 100000),
        (sv.netdev_speed, "-1\n", None),
        (sv.operstate, "up\n", "up"),
        (sv.node_guid, "b83f:d203:00a1:2c3e\n", "b83f:d203:00a1:2c3e"),
        (sv.bus_id, "00000000:1A:00.0", "0000:1a:00.0"),
        (sv.bus_id, "0008:01:00.0", "0008:01:00.0"),
    ],
)
def test_kernel_formats(parser: Callable[[str], Any], text: str, value: Any) -> None:
    assert parser(text) == value


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (sv.link_speed, "32.0 GT/s PCIe"),  # no newline: cut short
        (sv.link_speed, "32.0 GT\n"),
        (sv.link_speed, "3.0 GT/s PCIe\n"),  # not a PCIe rate
        (sv.link_width, "7\n"),
        (sv.netdev_speed, "100\n" * 2),
        (sv.netdev_speed, "1400000\n"),  # no such Ethernet speed
        (sv.ib_rate, "1400 Gb/sec (4X NDR)\n"),  # 4 x 100 is not 1400
        (sv.ib_rate, "400 Gb/sec (4X\n"),
        (sv.ib_rate, "400 Gb/sec (4X)\n"),
        (sv.ib_state, "14: ACTIVE\n"),
        (sv.ib_state, "4: ACTIVEX\n"),
        (sv.ib_state, "5: LinkUp\n"),  # a phys_state, not a state
        (sv.hex_id, "0x10\n"),
        (sv.pci_class, "0x0302\n"),
        (sv.numa_node, "-2\n"),
        (sv.link_layer, "Infini\n"),
        (sv.bus_id, "0000:1g:00.0"),
        (sv.bus_id, "100000000:00:00.0"),
    ],
)
def test_rejects_what_the_kernel_never_prints(parser: Callable[[str], Any], text: str) -> None:
    with pytest.raises(ValueError, match=r"not a|truncated|inconsistent|out of range"):
        parser(text)


@given(st.sampled_from(PARSERS), st.text(max_size=60))
def test_parsers_only_ever_raise_value_error(parser: Callable[[str], Any], text: str) -> None:
    with contextlib.suppress(ValueError):
        parser(text)


@given(st.sampled_from(PARSERS), st.binary(max_size=60))
def test_parsers_survive_binary_garbage(parser: Callable[[str], Any], data: bytes) -> None:
    with contextlib.suppress(ValueError):
        parser(data.decode("utf-8", errors="replace"))


@given(st.sampled_from(sorted(sv.PCIE_GEN)), st.sampled_from(["", " PCIe"]))
def test_link_speed_round_trip(speed: float, suffix: str) -> None:
    text = f"{speed:.1f}" if speed != int(speed) or suffix else f"{int(speed)}"
    assert sv.link_speed(f"{text} GT/s{suffix}\n") == speed
    assert sv.pcie_gen(speed) == sv.PCIE_GEN[speed]


@given(
    st.sampled_from(sorted(sv.IB_WIDTHS)),
    st.sampled_from(sorted(sv.IB_LANE_GBPS)),
)
def test_ib_rate_round_trip(width: int, name: str) -> None:
    rate = width * sv.IB_LANE_GBPS[name]
    whole, half = int(rate), rate - int(rate) >= 0.5
    text = f"{whole}{'.5' if half else ''} Gb/sec ({width}X {name})\n"
    assert sv.ib_rate(text) == whole + (0.5 if half else 0.0)


@given(st.text(max_size=30))
def test_truncation_is_never_accepted_as_a_value(text: str) -> None:
    # Without the kernel's trailing newline a value may be a prefix of another.
    for parser in (sv.integer, sv.netdev_speed, sv.link_width, sv.numa_node):
        with pytest.raises(ValueError, match="truncated"):
            parser(text.rstrip("\n"))
