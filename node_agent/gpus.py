"""The node's GPUs: sysfs PCI devices merged with what NVML / nvidia-smi reported."""

from __future__ import annotations

from typing import Final

from dynamiccl.api.node_topology import Gpu, NvLinkPeer, PcieLink
from dynamiccl.node_agent import gpu_table, pci
from dynamiccl.node_agent import sysfs_values as sv
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.gpu_report import GpuReport, ReportedGpu
from dynamiccl.node_agent.hostroot import HostRoot

PROC_GPUS: Final = "/proc/driver/nvidia/gpus"
_PCIE_ATTRS: Final = ("max_link_speed", "max_link_width")


def procfs_visible(host: HostRoot) -> set[str] | None:
    """Bus ids under /proc/driver/nvidia/gpus (container runtimes mount only the visible ones)."""
    entries = host.listdir(PROC_GPUS)
    if entries is None:
        return None
    out: set[str] = set()
    for e in entries:
        try:
            out.add(sv.bus_id(e))
        except ValueError:
            continue
    return out


def _pci_conditions(dev: pci.PciDevice, field: str, conds: Conditions) -> None:
    for p in dev.problems:
        base = p.attr.split(" ")[0]
        what = "pcie" if base in _PCIE_ATTRS else {"numa_node": "numaNode"}.get(base, base)
        conds.add(f"{field}.{what}", p.reason, f"{p.path}: {p.detail}")


def _one(
    bus: str,
    dev: pci.PciDevice | None,
    rep: ReportedGpu | None,
    visible: bool | None,
    conds: Conditions,
) -> Gpu:
    field = f"gpus[{bus}]"
    product = gpu_table.PRODUCTS.get(dev.device) if dev and dev.device is not None else None
    name = rep.name if rep and rep.name else (product.product if product else None)
    model = gpu_table.model_from_name(rep.name) if rep and rep.name else None
    model = model or (product.model if product else None)
    sm = rep.sm if rep and rep.sm is not None else (product.sm if product else None)
    if model is None:
        dev_id = pci.fmt_id(dev.device) if dev else None
        conds.add(f"{field}.model", "UnknownProduct", f"no name source for device id {dev_id}")
    if dev is not None:
        _pci_conditions(dev, field, conds)
    links: int | None = None
    if rep is not None and rep.nvlink_known:
        links = rep.active_links
    elif product is not None and not product.nvlink:
        links = 0  # the part has no NVLink at all
    elif visible:
        conds.add(f"{field}.nvlink", "NoSource", "active NVLinks need NVML or nvidia-smi")
    per_link = gpu_table.nvlink_link_gbps(sm)
    gbps: float | None = None
    if links == 0:
        gbps = 0.0
    elif links is not None and per_link is not None:
        gbps = links * per_link
    elif links is not None:
        conds.add(f"{field}.nvlinkGbps", "UnknownGeneration", f"no NVLink speed for sm {sm}")
    peers = [
        NvLinkPeer(remote=link.remote, remote_bus_id=link.remote_bus_id, links=link.links)
        for link in (rep.nvlinks if rep and rep.nvlink_known else [])
    ]
    return Gpu(
        bus_id=bus,
        index=rep.index if rep else None,
        visible=visible,
        model=model,
        product=name,
        architecture=gpu_table.architecture(sm),
        compute_capability=f"{sm // 10}.{sm % 10}" if sm is not None else None,
        vendor_id=pci.fmt_id(dev.vendor) if dev else None,
        device_id=pci.fmt_id(dev.device) if dev else None,
        numa_node=dev.numa_node if dev else None,
        pcie=dev.link if dev else PcieLink(),
        nvlink_links=links,
        nvlink_gbps=gbps,
        nvlink_peers=peers,
        mig_enabled=rep.mig_enabled if rep else None,
        fabric=rep.fabric if rep else None,
    )


def build(
    host: HostRoot,
    scan: pci.PciScan,
    report: GpuReport | None,
    in_container: bool | None,
    conds: Conditions,
) -> list[Gpu]:
    """Every GPU of the node, ordered by bus id, with what this container can use."""
    reported = report.by_bus() if report else {}
    sysfs = {d.bus_id: d for d in scan.gpus()}
    if report is not None and sysfs and not set(reported) <= set(sysfs):
        extra = sorted(set(reported) - set(sysfs))
        conds.add("gpus", "Inconsistent", f"{report.source.value} GPUs not in sysfs: {extra}")
    proc = procfs_visible(host)
    trust_report = report is not None
    if report is not None and proc is not None and proc != set(reported):
        # A short or stale GPU list must not shrink the GPU count silently.
        conds.add(
            "container.gpusVisible",
            "Inconsistent",
            f"{report.source.value} lists {len(reported)} GPUs, {PROC_GPUS} lists {len(proc)}",
        )
        trust_report = False
    out: list[Gpu] = []
    for bus in sorted(set(sysfs) | set(reported) | (proc or set())):
        visible: bool | None
        if trust_report:
            visible = bus in reported
        elif report is None and proc is not None:
            visible = bus in proc
        elif report is None and in_container is False:
            visible = True
        else:
            visible = None
        out.append(_one(bus, sysfs.get(bus), reported.get(bus), visible, conds))
    if out and all(g.visible is None for g in out):
        conds.add("container.gpusVisible", "NoSource", "no NVML, nvidia-smi or procfs GPU list")
    return out
