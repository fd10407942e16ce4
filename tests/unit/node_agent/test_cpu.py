"""/proc/cpuinfo and NUMA nodes."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.node_agent import cpu
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.hostroot import HostRoot


def test_x86_and_numa(fixture_root: Any) -> None:
    conds = Conditions()
    s = cpu.scan(HostRoot(fixture_root("dgx-a100")), conds)
    assert (s.cpu.arch, s.cpu.vendor, s.cpu.family, s.cpu.model) == (
        "x86_64",
        "AuthenticAMD",
        23,
        49,
    )
    assert [n.id for n in s.cpu.numa_nodes] == list(range(8))
    assert s.cpu.numa_nodes[3].cpus == "48-63,176-191"
    assert len(s.cpumaps) == 8
    assert len(conds) == 0


def test_arm() -> None:
    info = cpu.parse_cpuinfo("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n")
    assert info == cpu.CpuInfo(arch="arm64", vendor="ARM", model_name="Neoverse-V2")


@given(st.text(max_size=300))
def test_cpuinfo_parser_never_raises(text: str) -> None:
    info = cpu.parse_cpuinfo(text)
    assert info.arch in (None, "x86_64", "arm64")


def test_garbled_cpulist_is_named(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    (root / "sys/devices/system/node/node1/cpulist").write_text("56-111,16")
    conds = Conditions()
    s = cpu.scan(HostRoot(root), conds)
    assert s.cpu.numa_nodes[1].cpus is None
    assert [c.field for c in conds.items()] == ["cpu.numaNodes[1].cpulist"]
