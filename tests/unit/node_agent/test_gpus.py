"""Merging sysfs GPUs with NVML/nvidia-smi reports; visibility."""

from __future__ import annotations

from typing import Any

from dynamiccl.api.node_topology import NvLinkRemote, Source
from dynamiccl.node_agent import gpus, pci
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.gpu_report import GpuReport, ReportedGpu, ReportedLink
from dynamiccl.node_agent.hostroot import HostRoot


def build(
    root: Any, report: GpuReport | None, in_container: bool | None = False
) -> tuple[list[Any], Conditions]:
    host = HostRoot(root)
    conds = Conditions()
    return gpus.build(host, pci.scan(host), report, in_container, conds), conds


def test_report_decides_visibility_and_links(fixture_root: Any) -> None:
    rep = GpuReport(Source.NVML)
    for bus in ("0000:40:00.0", "0000:4f:00.0"):
        g = ReportedGpu(bus_id=bus, name="NVIDIA H100 80GB HBM3", sm=90, nvlink_known=True)
        g.nvlinks = [ReportedLink(NvLinkRemote.NVSWITCH, None, 18)]
        rep.gpus.append(g)
    out, conds = build(fixture_root("container-2of8"), rep)
    assert [g.visible for g in out] == [False, True, True, False, False, False, False, False]
    assert [g.nvlink_gbps for g in out if g.visible] == [450.0, 450.0]
    assert len(conds) == 0


def test_procfs_decides_visibility_without_a_report(fixture_root: Any) -> None:
    out, _ = build(fixture_root("container-2of8"), None, in_container=True)
    assert sum(bool(g.visible) for g in out) == 2


def test_no_visibility_source_is_named(tmp_path: Any, host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    for d in (root / "proc/driver/nvidia/gpus").iterdir():
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    (root / "proc/driver/nvidia/gpus").rmdir()
    out, conds = build(root, None, in_container=None)
    assert all(g.visible is None for g in out)
    assert "container.gpusVisible" in {c.field for c in conds.items()}


def test_product_without_nvlink_needs_no_report(fixture_root: Any) -> None:
    out, conds = build(fixture_root("pcie-l40s"), None)
    assert {(g.model, g.nvlink_links, g.nvlink_gbps, g.architecture) for g in out} == {
        ("L40S", 0, 0.0, "ada")
    }
    assert len(conds) == 0
