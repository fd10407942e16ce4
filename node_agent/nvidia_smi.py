"""The nvidia-smi fallback when NVML cannot be used from Python.

Two outputs, run through :meth:`HostRoot.run` (recorded in fixtures):

* ``nvidia-smi --query-gpu=index,name,pci.bus_id,compute_cap --format=csv,noheader``
  names each GPU index and its PCI bus id;
* ``nvidia-smi topo -m`` gives the connection matrix: ``NV#`` = # bonded NVLinks.

``topo -m`` cannot tell an NVSwitch from direct NVLinks. A GPU's links go to
an NVSwitch when NVSwitches are visible on PCI or when it reports more links
in total than its generation has; they go to GPUs directly when the GPU is
not linked to every peer; otherwise the far end stays ``unknown``.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from typing import Final

from dynamiccl.api.node_topology import NvLinkRemote, Source
from dynamiccl.node_agent import gpu_table
from dynamiccl.node_agent import sysfs_values as sv
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.gpu_report import GpuReport, ReportedGpu, ReportedLink
from dynamiccl.node_agent.hostroot import HostRoot

QUERY_ARGS: Final = [
    "nvidia-smi",
    "--query-gpu=index,name,pci.bus_id,compute_cap",
    "--format=csv,noheader",
]
TOPO_ARGS: Final = ["nvidia-smi", "topo", "-m"]
QUERY_RECORD: Final = "nvidia-smi-query-gpu.csv"
TOPO_RECORD: Final = "nvidia-smi-topo-m.txt"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CELL = re.compile(r"X|SYS|NODE|PHB|PXB|PIX|PXN|SOC|NV([0-9]{1,2})")
_DEVICE = re.compile(r"(GPU[0-9]{1,3}|NIC[0-9]{1,3}|[A-Za-z][A-Za-z0-9_]*_[0-9]{1,3})")
_NIC_LEGEND = re.compile(r"^\s*(NIC[0-9]{1,3}):\s*(\S+)\s*$")


@dataclass
class TopoMatrix:
    """``nvidia-smi topo -m`` as data."""

    devices: list[str]
    cells: dict[tuple[str, str], str]
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)

    def nvlinks(self, a: str, b: str) -> int:
        m = _CELL.fullmatch(self.cells.get((a, b), ""))
        return int(m.group(1)) if m and m.group(1) else 0

    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]


@dataclass(frozen=True)
class QueriedGpu:
    """One line of ``--query-gpu``."""

    index: int
    name: str
    bus_id: str
    sm: int | None


def parse_topo(text: str) -> TopoMatrix:
    """Parse ``nvidia-smi topo -m``; ``ValueError`` when it is not that output."""
    lines = [_ANSI.sub("", line).rstrip("\n") for line in text.splitlines()]
    header_at = next(
        (i for i, line in enumerate(lines) if line[:1] in ("\t", " ") and "GPU0" in line), None
    )
    if header_at is None:
        raise ValueError("no GPU0 column header")
    header = [c.strip() for c in lines[header_at].split("\t")][1:]
    devices: list[str] = []
    for col in header:
        if not _DEVICE.fullmatch(col):
            break
        devices.append(col)
    if not devices or len(set(devices)) != len(devices):
        raise ValueError("bad device columns")
    n = len(devices)
    cells: dict[tuple[str, str], str] = {}
    affinity: dict[str, str] = {}
    seen: set[str] = set()
    for line in lines[header_at + 1 :]:
        parts = [c.strip() for c in line.split("\t")]
        if not parts or parts[0] not in devices:
            if line.strip() == "" or line.strip().startswith("Legend"):
                break
            raise ValueError(f"unexpected row {line[:40]!r}")
        row = parts[0]
        values = parts[1 : 1 + n]
        if len(values) != n or row in seen:
            raise ValueError(f"row {row}: {len(values)} cells for {n} devices")
        seen.add(row)
        for col, value in zip(devices, values, strict=True):
            if not _CELL.fullmatch(value):
                raise ValueError(f"row {row}, column {col}: {value[:10]!r}")
            cells[(row, col)] = value
        if len(parts) > 1 + n and parts[1 + n]:
            affinity[row] = parts[1 + n]
    if seen != set(devices):
        raise ValueError("matrix is missing rows (truncated?)")
    for a in devices:
        if cells[(a, a)] != "X":
            raise ValueError(f"{a}: diagonal is not X")
        for b in devices:
            if cells[(a, b)].startswith("NV") != cells[(b, a)].startswith("NV") or (
                cells[(a, b)].startswith("NV") and cells[(a, b)] != cells[(b, a)]
            ):
                raise ValueError(f"{a}/{b}: NVLink counts are not symmetric")
    legend: dict[str, str] = {}
    for line in lines:
        m = _NIC_LEGEND.match(line)
        if m and m.group(1) in devices:
            legend[m.group(1)] = m.group(2)
    return TopoMatrix(devices=devices, cells=cells, cpu_affinity=affinity, nic_names=legend)


def parse_query(text: str) -> list[QueriedGpu]:
    """Parse the ``--query-gpu`` CSV; ``ValueError`` on any malformed line."""
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), skipinitialspace=True))
    except csv.Error as exc:
        raise ValueError(f"not CSV: {exc}") from exc
    gpus: list[QueriedGpu] = []
    for row in rows:
        if not row:
            continue
        if len(row) != 4:
            raise ValueError(f"expected 4 fields, got {len(row)}")
        index_s, name, bus, cap = (c.strip() for c in row)
        if not index_s.isdigit() or not name:
            raise ValueError(f"bad index/name {index_s[:10]!r}")
        m = re.fullmatch(r"([0-9]{1,2})\.([0-9])", cap)
        sm = int(m.group(1)) * 10 + int(m.group(2)) if m else None
        if m is None and cap not in ("[N/A]", "N/A"):
            raise ValueError(f"bad compute capability {cap[:10]!r}")
        gpus.append(QueriedGpu(index=int(index_s), name=name, bus_id=sv.bus_id(bus), sm=sm))
    if len({g.index for g in gpus}) != len(gpus):
        raise ValueError("duplicate GPU index")
    return gpus


def _links_of(
    gpu: QueriedGpu, topo: TopoMatrix, by_label: dict[str, QueriedGpu], nvswitch_visible: bool
) -> list[ReportedLink]:
    me = f"GPU{gpu.index}"
    peers = [p for p in topo.gpus() if p != me and p in by_label]
    counts = {p: topo.nvlinks(me, p) for p in peers}
    linked = {p: n for p, n in counts.items() if n > 0}
    if not linked:
        return []
    total = sum(linked.values())
    limit = gpu_table.max_nvlinks(gpu.sm) if gpu.sm is not None else None
    if nvswitch_visible or (limit is not None and total > limit):
        return [ReportedLink(NvLinkRemote.NVSWITCH, None, max(linked.values()))]
    if len(linked) < len(peers):
        return [ReportedLink(NvLinkRemote.GPU, by_label[p].bus_id, n) for p, n in linked.items()]
    return [ReportedLink(NvLinkRemote.UNKNOWN, by_label[p].bus_id, n) for p, n in linked.items()]


def collect(host: HostRoot, conds: Conditions, *, nvswitch_visible: bool) -> GpuReport | None:
    """GPU facts from nvidia-smi; ``None`` (with a condition) when it is not usable."""
    q = host.run(QUERY_ARGS, record=QUERY_RECORD)
    if q.text is None:
        conds.add("nvidia-smi", "Unavailable", q.error or "no output")
        return None
    try:
        queried = parse_query(q.text)
    except ValueError as exc:
        conds.add("nvidia-smi", "Garbled", f"--query-gpu output: {exc}")
        return None
    report = GpuReport(source=Source.NVIDIA_SMI)
    for g in queried:
        report.gpus.append(ReportedGpu(bus_id=g.bus_id, index=g.index, name=g.name, sm=g.sm))
    t = host.run(TOPO_ARGS, record=TOPO_RECORD)
    if t.text is None:
        conds.add("nvlinkMatrix", "Unavailable", f"nvidia-smi topo -m: {t.error}")
        return report
    try:
        topo = parse_topo(t.text)
    except ValueError as exc:
        conds.add("nvlinkMatrix", "Garbled", f"nvidia-smi topo -m: {exc}")
        return report
    by_label = {f"GPU{g.index}": g for g in queried}
    if set(topo.gpus()) != set(by_label):
        conds.add("nvlinkMatrix", "Inconsistent", "topo -m and --query-gpu list different GPUs")
        return report
    for rg, qg in zip(report.gpus, queried, strict=True):
        rg.nvlinks = _links_of(qg, topo, by_label, nvswitch_visible)
        rg.nvlink_known = True
    return report
