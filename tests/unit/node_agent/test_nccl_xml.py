"""NCCL topology XML: readable by NCCL's parser, structured by NCCL's rules.

``nccl_parse`` re-implements the acceptance rules of NCCL's src/graph/xml.cc
reader (token grammar, double-quoted values, 255-char strings, which element
may contain which, version 1) and the attribute checks of src/graph/topo.cc
(required attributes, link_speed strings NCCL knows, CPU arch/vendor).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from dynamiccl.node_agent import nccl_xml
from dynamiccl.node_agent.discover import discover
from dynamiccl.node_agent.hostroot import HostRoot

MAX_STR_LEN = 255
CHILDREN = {
    None: {"system"},
    "system": {"cpu"},
    "cpu": {"pci", "nic"},
    "pci": {"pci", "gpu", "nic", "pcilink"},
    "gpu": {"nvlink", "c2c"},
    "nic": {"net"},
}
NCCL_PCI_SPEEDS = {
    "2.5 GT/s", "5 GT/s", "8 GT/s", "16 GT/s", "32 GT/s", "2.5 GT/s PCIe", "5.0 GT/s PCIe",
    "8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe",
}  # fmt: skip
ARCHS = {"x86_64", "arm64", "ppc64"}
X86_VENDORS = {"GenuineIntel", "AuthenticAMD", "CentaurHauls", "  Shanghai  "}


@dataclass
class Node:
    name: str
    attrs: dict[str, str]
    parent: Node | None = None
    subs: list[Node] = field(default_factory=list)


def nccl_parse(text: str) -> Node:
    """Parse like NCCL's xmlLoadSub/xmlGetNode; AssertionError where NCCL would fail."""
    pos = 0
    root = Node("#root", {})
    stack = [root]
    token = re.compile(r'<(/?)([A-Za-z!][A-Za-z0-9_-]*)((?: [a-z_]+="[^"]*")*)(/?)>')
    while True:
        while pos < len(text) and text[pos] in " \n\r":
            pos += 1
        if pos == len(text):
            break
        m = token.match(text, pos)
        assert m, f"NCCL: expected a tag at {text[pos : pos + 30]!r}"
        close, name, attrs, single = m.groups()
        pos = m.end()
        assert len(name) < MAX_STR_LEN
        if close:
            assert stack[-1].name == name, f"XML Mismatch {stack[-1].name} / {name}"
            stack.pop()
            continue
        values = dict(re.findall(r' ([a-z_]+)="([^"]*)"', attrs))
        for k, v in values.items():
            assert len(k) < MAX_STR_LEN, k
            assert len(v) < MAX_STR_LEN, (k, v)
        parent = stack[-1]
        allowed = CHILDREN.get(None if parent is root else parent.name, set())
        assert name in allowed, f"NCCL ignores <{name}> inside <{parent.name}>"
        node = Node(name, values, parent)
        parent.subs.append(node)
        if not single:
            stack.append(node)
    assert stack == [root], f"unterminated {stack[-1].name}"
    assert len(root.subs) == 1
    return root.subs[0]


def walk(node: Node) -> list[Node]:
    out = [node]
    for s in node.subs:
        out += walk(s)
    return out


def check_topology_rules(system: Node) -> None:
    """What topo.cc needs from a file-provided topology."""
    assert system.attrs["version"] == "1"
    for n in walk(system):
        if n.name == "cpu":
            assert re.fullmatch(r"-?[0-9]+", n.attrs["numaid"])
            assert n.attrs.get("arch", "x86_64") in ARCHS
            if n.attrs.get("arch") == "x86_64":
                assert n.attrs["vendor"] in X86_VENDORS
                if n.attrs["vendor"] == "GenuineIntel":
                    assert {"familyid", "modelid"} <= set(n.attrs)
        if n.name == "pci":
            assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", n.attrs["busid"])
            assert re.fullmatch(r"0x[0-9a-f]{6}", n.attrs["class"])
            if "link_speed" in n.attrs:
                assert n.attrs["link_speed"] in NCCL_PCI_SPEEDS, n.attrs["link_speed"]
            if "link_width" in n.attrs:
                assert int(n.attrs["link_width"]) > 0
        if n.name == "gpu":
            assert n.parent is not None
            assert n.parent.name == "pci"
            assert int(n.attrs["sm"]) >= 60
            # dev, rank and gdr belong to the running job: NCCL must fill them.
            assert not {"dev", "rank", "gdr"} & set(n.attrs)
        if n.name == "nvlink":
            assert int(n.attrs["count"]) >= 1
            assert re.fullmatch(r"0x[0-9a-f]{6}", n.attrs["tclass"])
        if n.name == "net":
            assert n.attrs["name"]
            assert not {"dev", "guid"} & set(n.attrs)


def render(root: Any) -> tuple[str, Any]:
    disc = discover(HostRoot(root))
    return nccl_xml.render(disc), disc.topology


LAYOUTS = [
    "dgx-h100", "dgx-a100", "aws-p5", "roce-h200", "pcie-l40s", "gb200-nvl72-tray",
    "container-2of8",
]  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nccl_can_read_it(layout: str, fixture_root: Any) -> None:
    text, topo = render(fixture_root(layout))
    system = nccl_parse(text)
    check_topology_rules(system)
    nodes = walk(system)
    pci_gpus = {
        n.attrs["busid"] for n in nodes if n.name == "pci" and any(s.name == "gpu" for s in n.subs)
    }
    assert pci_gpus == {g.bus_id for g in topo.gpus}
    nets = {n.attrs["name"] for n in nodes if n.name == "net"}
    assert {n.name for n in topo.nics if n.fabric_member} <= nets


def test_dgx_h100_follows_nccls_pci_nesting(fixture_root: Any) -> None:
    system = nccl_parse(render(fixture_root("dgx-h100"))[0])
    cpus = {c.attrs["numaid"]: c for c in system.subs}
    assert set(cpus) == {"0", "1"}
    assert cpus["0"].attrs == {
        "numaid": "0",
        "affinity": "00000000,000000ff,ffffffff,ffff0000,00000000,00ffffff,ffffffff",
        "arch": "x86_64",
        "vendor": "GenuineIntel",
        "familyid": "6",
        "modelid": "143",
    }
    # GPU0 and mlx5_0 share one PCIe switch: its upstream port is their parent
    # (NCCL folds the downstream ports), directly under the CPU.
    switch = next(p for p in cpus["0"].subs if p.attrs["busid"] == "0000:16:00.0")
    assert [s.attrs["busid"] for s in switch.subs] == ["0000:18:00.0", "0000:19:00.0"]
    gpu_pci, nic_pci = switch.subs
    assert gpu_pci.attrs["link_speed"] == "32.0 GT/s PCIe"
    assert gpu_pci.attrs["link_width"] == "16"
    gpu = gpu_pci.subs[0]
    assert gpu.attrs == {"sm": "90"}
    assert [(n.attrs["target"], n.attrs["count"]) for n in gpu.subs] == [
        ("0000:05:00.0", "5"), ("0000:06:00.0", "4"), ("0000:07:00.0", "4"), ("0000:08:00.0", "5"),
    ]  # fmt: skip
    assert nic_pci.subs[0].subs[0].attrs == {"name": "mlx5_0", "port": "1", "speed": "400000"}


def test_hidden_nvswitch_and_arm(fixture_root: Any) -> None:
    system = nccl_parse(render(fixture_root("gb200-nvl72-tray"))[0])
    links = [n for n in walk(system) if n.name == "nvlink"]
    assert {(n.attrs["target"], n.attrs["count"], n.attrs["tclass"]) for n in links} == {
        ("fffffff:ffff:ff", "18", "0x068000")
    }
    assert {c.attrs.get("arch") for c in system.subs} == {"arm64"}
    assert all("vendor" not in c.attrs for c in system.subs)


def test_efa_nets_and_gpu_without_nvlink(fixture_root: Any) -> None:
    system = nccl_parse(render(fixture_root("aws-p5"))[0])
    nets = [n for n in walk(system) if n.name == "net"]
    assert len(nets) == 32
    assert {n.attrs["speed"] for n in nets} == {"100000"}
    l40s = nccl_parse(render(fixture_root("pcie-l40s"))[0])
    gpus = [n for n in walk(l40s) if n.name == "gpu"]
    assert len(gpus) == 8
    assert all(g.subs == [] for g in gpus)
    # Plain Ethernet fabric NICs appear (socket transport); the 1 GbE port does not.
    assert sorted(n.attrs["name"] for n in walk(l40s) if n.name == "net") == [
        "ens1f0np0",
        "ens1f1np1",
    ]


def test_unknown_values_are_omitted_not_invented(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    dev = (root / "sys/bus/pci/devices/0000:18:00.0").resolve()
    (dev / "max_link_speed").write_text("garbage\n")
    (root / "proc/cpuinfo").write_text("nothing useful\n")
    system = nccl_parse(render(root)[0])
    check_topology_rules(system)
    gpu_pci = next(n for n in walk(system) if n.attrs.get("busid") == "0000:18:00.0")
    assert "link_speed" not in gpu_pci.attrs
    assert gpu_pci.attrs["link_width"] == "16"
    assert all("arch" not in c.attrs for c in system.subs)


def test_parser_port_rejects_what_nccl_rejects() -> None:
    with pytest.raises(AssertionError):
        nccl_parse('<system version="1"><gpu sm="90"/></system>')
    with pytest.raises(AssertionError):
        nccl_parse("<system version='1'></system>")
    with pytest.raises(AssertionError):
        nccl_parse('<system version="1"><cpu numaid="0"></system>')
