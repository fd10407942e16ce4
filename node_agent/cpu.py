"""CPU vendor/model (``/proc/cpuinfo``) and NUMA layout (``/sys/devices/system/node``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from dynamiccl.api.node_topology import Cpu, NumaNode
from dynamiccl.node_agent import sysfs_values as sv
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.hostroot import HostRoot

NODE_DIR: Final = "/sys/devices/system/node"
ARM_IMPLEMENTERS: Final = {0x41: "ARM", 0x4E: "NVIDIA", 0x51: "Qualcomm", 0xC0: "Ampere"}
ARM_PARTS: Final = {0xD0C: "Neoverse-N1", 0xD40: "Neoverse-V1", 0xD4F: "Neoverse-V2"}
_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9 _]*?)\s*:\s?(.*)$")


@dataclass(frozen=True)
class CpuInfo:
    """What the first processor block of /proc/cpuinfo says."""

    arch: str | None = None
    vendor: str | None = None
    model_name: str | None = None
    family: int | None = None
    model: int | None = None


@dataclass
class CpuScan:
    """CPU facts plus the NUMA cpumaps NCCL's XML wants."""

    cpu: Cpu
    cpumaps: dict[int, str] = field(default_factory=dict)


def _int(text: str | None, base: int = 10) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), base)
    except ValueError:
        return None


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse the first processor block; unknown keys are ignored, garbage gives Nones."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        m = _LINE.match(line)
        if m:
            fields.setdefault(m.group(1).strip().lower(), m.group(2).strip())
    if "vendor_id" in fields:
        return CpuInfo(
            arch="x86_64",
            vendor=fields["vendor_id"] or None,
            model_name=fields.get("model name") or None,
            family=_int(fields.get("cpu family")),
            model=_int(fields.get("model")),
        )
    impl = _int(fields.get("cpu implementer"), 16) if "cpu implementer" in fields else None
    if impl is not None:
        part = _int(fields.get("cpu part"), 16)
        return CpuInfo(
            arch="arm64",
            vendor=ARM_IMPLEMENTERS.get(impl, f"0x{impl:02x}"),
            model_name=ARM_PARTS.get(part) if part is not None else None,
        )
    return CpuInfo()


def scan(host: HostRoot, conds: Conditions) -> CpuScan:
    """CPU and NUMA facts; unreadable pieces become conditions."""
    res = host.read("/proc/cpuinfo")
    info = CpuInfo()
    if res.text is None:
        conds.unreadable("cpu", "/proc/cpuinfo", res.error)
    else:
        info = parse_cpuinfo(res.text)
        if info.arch is None:
            conds.garbled("cpu", "/proc/cpuinfo", res.text)
    nodes: list[NumaNode] = []
    cpumaps: dict[int, str] = {}
    entries = host.listdir(NODE_DIR)
    if entries is None:
        conds.unreadable("cpu.numaNodes", NODE_DIR, "missing")
    for entry in entries or []:
        m = re.fullmatch(r"node([0-9]{1,4})", entry)
        if not m:
            continue
        nid = int(m.group(1))
        cpus: str | None = None
        for name in ("cpulist", "cpumap"):
            path = f"{NODE_DIR}/{entry}/{name}"
            r = host.read(path)
            if r.text is None:
                conds.unreadable(f"cpu.numaNodes[{nid}].{name}", path, r.error)
                continue
            try:
                if name == "cpulist":
                    cpus = sv.cpulist(r.text)
                else:
                    cpumaps[nid] = sv.cpumap(r.text)
            except ValueError:
                conds.garbled(f"cpu.numaNodes[{nid}].{name}", path, r.text)
        nodes.append(NumaNode(id=nid, cpus=cpus))
    nodes.sort(key=lambda n: n.id)
    cpu = Cpu(
        arch=info.arch,
        vendor=info.vendor,
        model_name=info.model_name,
        family=info.family,
        model=info.model,
        numa_nodes=nodes,
    )
    return CpuScan(cpu=cpu, cpumaps=cpumaps)
