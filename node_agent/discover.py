"""Compose every source into one :class:`NodeTopology`.

Order of GPU sources: NVML, then ``nvidia-smi``, then sysfs alone; the result
lists the sources used and a condition for every fact left unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamiccl.api.node_topology import Container, NodeTopology, NvSwitch, Source
from dynamiccl.node_agent import (
    container,
    cpu,
    gdr,
    gpus,
    interconnect,
    netdev,
    nics,
    nvidia_smi,
    nvml,
    pci,
    rdma,
    sharp,
    spec,
)
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.gpu_report import GpuReport
from dynamiccl.node_agent.hostroot import HostRoot


@dataclass(frozen=True)
class Discovery:
    """The topology plus the raw scans the NCCL XML writer needs."""

    topology: NodeTopology
    pci: pci.PciScan
    cpu: cpu.CpuScan


def node_name(host: HostRoot, conds: Conditions) -> str:
    """The host's name as the kernel knows it."""
    for path in ("/proc/sys/kernel/hostname", "/etc/hostname"):
        text = host.read_text(path)
        if text and text.strip() and len(text.strip()) <= 253 and "\n" not in text.strip():
            return text.strip()
    conds.add("nodeName", "Missing", "no hostname in /proc/sys/kernel/hostname or /etc/hostname")
    return "unknown-node"


def _gpu_report(host: HostRoot, scan: pci.PciScan, conds: Conditions) -> GpuReport | None:
    backend = nvml.backend_for(host, conds)
    report = nvml.collect(backend, conds) if backend is not None else None
    if report is None:
        report = nvidia_smi.collect(host, conds, nvswitch_visible=bool(scan.nvswitches()))
    return report


def _container(
    base: Container, found: list[object], scan: pci.PciScan, conds: Conditions
) -> Container:
    flags = [getattr(g, "visible", None) for g in found]
    visible = sum(1 for v in flags if v) if flags and None not in flags else None
    on_node = len(flags) if scan.readable and not scan.unidentified else None
    if scan.unidentified:
        shown = scan.unidentified[:4]
        conds.add("container.gpusOnNode", "Unknown", f"unidentified PCI functions: {shown}")
    boundary = None if visible is None or on_node is None else visible < on_node
    return base.model_copy(
        update={"gpus_visible": visible, "gpus_on_node": on_node, "boundary": boundary}
    )


def discover(
    host: HostRoot, *, name: str | None = None, sharp_override: bool | None = None
) -> Discovery:
    """Discover this node's communication topology from ``host``."""
    conds = Conditions()
    sources: list[Source] = []
    node = name or node_name(host, conds)

    scan = pci.scan(host)
    if not scan.readable:
        conds.add("gpus", "Missing", f"{pci.PCI_DEVICES}: not readable (is /sys mounted?)")
    rd = rdma.scan(host)
    nd = netdev.scan(host)
    if scan.readable or rd.readable or nd.readable:
        sources.append(Source.SYSFS)
    cpus = cpu.scan(host, conds)
    peer = gdr.scan(host, conds)
    box = container.scan(host, conds)
    if cpus.cpu.arch is not None or peer.enabled is not None or box.cgroup_version is not None:
        sources.append(Source.PROCFS)

    report = _gpu_report(host, scan, conds)
    if report is not None:
        sources.append(report.source)
    found = gpus.build(host, scan, report, box.in_container, conds)
    ic = interconnect.analyse(found, len(scan.nvswitches()), conds)
    nic_list, choice = nics.build(scan, rd, nd, conds)
    shp = sharp.scan(host, choice.fabric, sharp_override)
    if shp.capable is None and choice.fabric is not None:
        conds.add("sharp", "Unknown", f"{shp.basis}; mount the host's / or set the override label")
    if sharp_override is not None:
        sources.append(Source.OVERRIDE)

    topo = NodeTopology(
        node_name=node,
        gpus=found,
        nics=nic_list,
        nvswitches=[
            NvSwitch(bus_id=d.bus_id, device_id=pci.fmt_id(d.device)) for d in scan.nvswitches()
        ],
        nvlink_matrix=ic.matrix,
        intra=ic.intra,
        nvlink_gbps=ic.nvlink_gbps,
        nvswitch=ic.nvswitch,
        nvls=ic.nvls,
        fabric=choice.fabric,
        nics_per_node=choice.nics_per_node,
        nic_gbps=choice.nic_gbps,
        pcie_gen=ic.pcie_gen,
        sharp=shp,
        gdr=peer,
        cpu=cpus.cpu,
        container=_container(box, list(found), scan, conds),
        driver_version=report.driver_version if report else None,
        sources=sources,
        recorded=host.recorded is not None,
    )
    topo_spec, unknown = spec.build(topo, conds)
    topo = topo.model_copy(
        update={"spec": topo_spec, "spec_unknown": unknown, "conditions": conds.items()}
    )
    return Discovery(topology=topo, pci=scan, cpu=cpus)
