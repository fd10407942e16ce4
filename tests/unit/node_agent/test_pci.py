"""PCI scan: the devices that matter, their bridges, NCCL's link capability rule."""

from __future__ import annotations

from typing import Any

from dynamiccl.node_agent import pci
from dynamiccl.node_agent.hostroot import HostRoot


def test_scan_finds_gpus_nics_switches_and_their_bridges(fixture_root: Any) -> None:
    scan = pci.scan(HostRoot(fixture_root("dgx-h100")))
    assert scan.readable
    assert [d.bus_id for d in scan.gpus()][:2] == ["0000:18:00.0", "0000:40:00.0"]
    assert len(scan.gpus()) == 8
    assert len(scan.nvswitches()) == 4
    gpu = scan.devices["0000:18:00.0"]
    assert gpu.chain == (
        "pci0000:15",
        "0000:15:01.0",
        "0000:16:00.0",
        "0000:17:00.0",
        "0000:18:00.0",
    )
    assert (gpu.vendor, gpu.device, gpu.class_code, gpu.numa_node) == (0x10DE, 0x2330, 0x030200, 0)
    assert gpu.driver == "nvidia"
    assert gpu.problems == []
    assert (gpu.link.gen, gpu.link.speed_gts, gpu.link.width) == (5, 32.0, 16)
    # The switch ports on the way are read too (NCCL nests by them).
    assert scan.devices["0000:16:00.0"].is_bridge
    assert scan.devices["0000:19:00.0"].is_network


def test_link_is_the_lower_of_device_and_port(fixture_root: Any) -> None:
    # GB200 GPUs are Gen6 parts behind Gen5 root ports.
    scan = pci.scan(HostRoot(fixture_root("gb200-nvl72-tray")))
    gpu = scan.devices["0008:01:00.0"]
    assert gpu.max_speed == 64.0
    assert gpu.link.speed_gts == 32.0
    assert gpu.link.gen == 5


def test_garbled_class_is_a_problem_not_a_device_type(host_copy: Any) -> None:
    root = host_copy("pcie-l40s")
    (root / "sys/bus/pci/devices/0000:13:00.0/class").write_text("0x03\n")
    scan = pci.scan(HostRoot(root))
    dev = scan.devices["0000:13:00.0"]
    assert dev.class_code is None
    assert not dev.is_gpu
    assert [(p.attr, p.reason) for p in dev.problems] == [("class", "Garbled")]
    assert len(scan.gpus()) == 7


def test_no_sysfs(tmp_path: Any) -> None:
    assert pci.scan(HostRoot(tmp_path)).readable is False
