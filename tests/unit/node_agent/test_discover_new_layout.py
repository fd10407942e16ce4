"""Layouts discovery was not written against, built here and run through the same CLI path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hostbuild import HostBuilder
from machines import ETH_CTRL, Gpu, direct_links, gpu_pci, nvml_doc, root_port, smi_outputs
from typer.testing import CliRunner

from dynamiccl.cli import app

G4 = "16.0 GT/s PCIe"


def discover_json(root: Path) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["discover", "--root", str(root), "--json"])
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.output)
    return out


def four_gpu_box(
    root: Path, links: dict[int, dict[int, int]], *, nvml_links: bool = True
) -> list[Gpu]:
    """1 socket, 4x A100 80GB PCIe on root ports, 2x ConnectX-6 Dx RoCE at 100 GbE."""
    b = HostBuilder(root)
    b.hostname("edge-4gpu")
    b.write("/usr/lib/os-release", 'NAME="Debian"')
    b.recorded_dir()
    b.cpuinfo_x86("AuthenticAMD", 25, 1, "AMD EPYC 7543 32-Core Processor", 64)
    b.numa({0: "0-63"}, 64)
    buses = [f"0000:{0x21 + 0x20 * i:02x}:00.0" for i in range(4)]
    gpus = []
    for i, bus in enumerate(buses):
        rc, rp = f"pci0000:{0x20 + 0x20 * i:02x}", f"0000:{0x20 + 0x20 * i:02x}:03.1"
        root_port(b, rc, rp, 0, G4)
        peers = {buses[j]: n for j, n in links.get(i, {}).items()}
        g = Gpu(bus, 0, "NVIDIA A100 80GB PCIe", (8, 0), direct_links(peers))
        gpu_pci(b, g, parent=rp, device=0x20B5, speed=G4, sub=0x1533)
        gpus.append(g)
    root_port(b, "pci0000:c0", "0000:c0:01.1", 0, G4)
    for f in (0, 1):
        bus = f"0000:c1:00.{f}"
        b.pci(
            bus,
            "0000:c0:01.1",
            cls=ETH_CTRL,
            vendor=0x15B3,
            device=0x101D,
            numa=0,
            speed=G4,
            driver="mlx5_core",
        )
        b.rdma(f"mlx5_{f}", bus, rate="100 Gb/sec (4X EDR)", link_layer="Ethernet")
        b.net(f"enp193s0f{f}np{f}", bus, speed=100000)
    b.modules(["nvidia_peermem", "nvidia", "mlx5_ib", "mlx5_core"])
    b.host_process()
    b.gpu_devices(buses, [0, 1, 2, 3])
    doc = nvml_doc("550.54.15", gpus)
    if nvml_links:
        # A100 PCIe has 12 NVLink ports; unused ones answer "inactive".
        for d, g in zip(doc["devices"], gpus, strict=True):
            d["nvlink"] += [{"state": 0}] * (12 - len(g.links))
    b.nvml(doc)
    b.smi(
        *smi_outputs(b, gpus, [("mlx5_0", "0000:c1:00.0"), ("mlx5_1", "0000:c1:00.1")], {0: "0-63"})
    )
    return gpus


BASE = {
    "name": "edge-4gpu", "gpu": "A100", "gpus_per_node": 4, "nodes": 1, "pcie_gen": 4,
    "nics_per_node": 2, "nic_Gbps": 100.0, "fabric": "roce", "sharp": False, "gdr": True,
}  # fmt: skip


def test_four_pcie_gpus_and_two_roce_nics(tmp_path: Path) -> None:
    four_gpu_box(tmp_path, links={})
    topo = discover_json(tmp_path)
    assert topo["spec"] == {**BASE, "intra": "pcie", "nvlink_GBps": 0.0, "nvls": False}
    assert topo["conditions"] == []
    assert [(n["name"], n["kind"], n["fabricMember"]) for n in topo["nics"]] == [
        ("mlx5_0", "roce", True),
        ("mlx5_1", "roce", True),
    ]
    assert [g["nvlinkLinks"] for g in topo["gpus"]] == [0, 0, 0, 0]


def test_bridged_pairs_are_pcie_between_pairs(tmp_path: Path) -> None:
    # NVLink bridges join GPU0-GPU1 and GPU2-GPU3 (12 links each); pairs meet over PCIe.
    four_gpu_box(tmp_path, links={0: {1: 12}, 1: {0: 12}, 2: {3: 12}, 3: {2: 12}})
    topo = discover_json(tmp_path)
    assert topo["spec"] == {**BASE, "intra": "pcie", "nvlink_GBps": 0.0, "nvls": False}
    assert [c["reason"] for c in topo["conditions"]] == ["PartialNvlink"]
    assert topo["nvlinkMatrix"]["links"] == [
        [0, 12, 0, 0],
        [12, 0, 0, 0],
        [0, 0, 0, 12],
        [0, 0, 12, 0],
    ]
    assert topo["nvswitch"] is False


def test_full_direct_nvlink_mesh_is_nvlink(tmp_path: Path) -> None:
    mesh = {i: {j: 4 for j in range(4) if j != i} for i in range(4)}
    four_gpu_box(tmp_path, links=mesh)
    topo = discover_json(tmp_path)
    assert topo["spec"] == {**BASE, "intra": "nvlink", "nvlink_GBps": 300.0, "nvls": False}
    assert topo["gpus"][0]["nvlinkPeers"] == [
        {"remote": "gpu", "remoteBusId": f"0000:{b}:00.0", "links": 4} for b in ("41", "61", "81")
    ]


def test_full_mesh_through_nvidia_smi_is_ambiguous(tmp_path: Path) -> None:
    # topo -m shows NV4 to every peer: an NVSwitch would look the same. Not guessed.
    mesh = {i: {j: 4 for j in range(4) if j != i} for i in range(4)}
    four_gpu_box(tmp_path, links=mesh)
    (tmp_path / ".dynamiccl-recorded/nvml.json").unlink()
    topo = discover_json(tmp_path)
    assert topo["intra"] is None
    assert {"intra", "nvlink_GBps", "nvls"} <= set(topo["specUnknown"])
    assert topo["nvlinkMatrix"]["links"][0] == [0, 4, 4, 4]


def test_bridged_pairs_through_nvidia_smi_are_direct(tmp_path: Path) -> None:
    four_gpu_box(tmp_path, links={0: {1: 12}, 1: {0: 12}, 2: {3: 12}, 3: {2: 12}})
    (tmp_path / ".dynamiccl-recorded/nvml.json").unlink()
    topo = discover_json(tmp_path)
    assert topo["spec"] == {**BASE, "intra": "pcie", "nvlink_GBps": 0.0, "nvls": False}
    assert topo["sources"][-1] == "nvidia-smi"
