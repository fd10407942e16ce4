"""What a GPU management source (NVML or nvidia-smi) reported, in one shape.

Both ``nvml.collect`` and ``nvidia_smi.collect`` produce a :class:`GpuReport`;
``gpus.build`` merges it with sysfs. NVLinks are aggregated per remote device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dynamiccl.api.node_topology import GpuFabric, NvLinkRemote, Source


@dataclass(frozen=True)
class ReportedLink:
    """Active NVLinks from one GPU to one remote device."""

    remote: NvLinkRemote
    remote_bus_id: str | None
    links: int


@dataclass
class ReportedGpu:
    """One GPU as NVML / nvidia-smi sees it (from inside this container)."""

    bus_id: str
    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    sm: int | None = None
    mig_enabled: bool | None = None
    nvlink_known: bool = False
    nvlinks: list[ReportedLink] = field(default_factory=list)
    fabric: GpuFabric | None = None

    @property
    def active_links(self) -> int | None:
        """Active NVLinks of this GPU (``None`` when unknown)."""
        if not self.nvlink_known:
            return None
        return sum(link.links for link in self.nvlinks)


@dataclass
class GpuReport:
    """All GPUs one source reported."""

    source: Source
    driver_version: str | None = None
    gpus: list[ReportedGpu] = field(default_factory=list)

    def by_bus(self) -> dict[str, ReportedGpu]:
        return {g.bus_id: g for g in self.gpus}


def aggregate(links: list[tuple[NvLinkRemote, str | None]]) -> list[ReportedLink]:
    """Count per (remote kind, remote bus id), ordered by remote bus id."""
    counts: dict[tuple[NvLinkRemote, str | None], int] = {}
    for key in links:
        counts[key] = counts.get(key, 0) + 1
    return [
        ReportedLink(remote=kind, remote_bus_id=bus, links=n)
        for (kind, bus), n in sorted(counts.items(), key=lambda kv: (kv[0][1] or "", kv[0][0]))
    ]
