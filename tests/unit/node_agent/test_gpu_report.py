"""Aggregating NVLinks per remote device."""

from __future__ import annotations

from dynamiccl.api.node_topology import NvLinkRemote, Source
from dynamiccl.node_agent.gpu_report import GpuReport, ReportedGpu, aggregate


def test_aggregate_counts_per_remote() -> None:
    sw, gpu = NvLinkRemote.NVSWITCH, NvLinkRemote.GPU
    links = aggregate(
        [(sw, "0000:06:00.0"), (gpu, "0000:19:00.0"), (sw, "0000:05:00.0"), (sw, "0000:06:00.0")]
    )
    assert [(x.remote_bus_id, x.links) for x in links] == [
        ("0000:05:00.0", 1), ("0000:06:00.0", 2), ("0000:19:00.0", 1),
    ]  # fmt: skip


def _active_links(g: ReportedGpu) -> int | None:
    return g.active_links  # a fresh read (mypy would keep the narrowing of g.active_links)


def test_active_links_unknown_until_known() -> None:
    g = ReportedGpu(bus_id="0000:18:00.0")
    assert _active_links(g) is None
    g.nvlink_known = True
    assert _active_links(g) == 0
    assert GpuReport(Source.NVML, gpus=[g]).by_bus() == {"0000:18:00.0": g}
