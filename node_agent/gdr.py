"""GPUDirect RDMA: is a GPU peer-memory kernel module loaded (``/proc/modules``)?

``nvidia_peermem`` (driver >= 465), the legacy ``nv_peer_mem``, and
``efa_nv_peermem`` (EFA) let a NIC DMA straight into GPU memory. GPUDirect
through dma-buf needs no such module and is not detectable here; ``enabled``
is therefore about the peer-memory path only (docs/node-agent.md).
"""

from __future__ import annotations

import re
from typing import Final

from dynamiccl.api.node_topology import Gdr
from dynamiccl.node_agent.conditions import Conditions
from dynamiccl.node_agent.hostroot import HostRoot

PEERMEM_MODULES: Final = ("nvidia_peermem", "nv_peer_mem", "efa_nv_peermem")
_MODULE_LINE = re.compile(r"^([A-Za-z0-9_]+) [0-9]+ [0-9-]+ ")


def parse_modules(text: str) -> list[str]:
    """Names of the loaded modules; lines not in /proc/modules format are skipped."""
    names: list[str] = []
    for line in text.splitlines():
        m = _MODULE_LINE.match(line)
        if m:
            names.append(m.group(1))
    return names


def scan(host: HostRoot, conds: Conditions) -> Gdr:
    """Peer-memory modules loaded on the host."""
    res = host.read("/proc/modules")
    if res.text is None:
        conds.unreadable("gdr", "/proc/modules", res.error)
        return Gdr()
    loaded = parse_modules(res.text)
    if not loaded and res.text.strip():
        conds.garbled("gdr", "/proc/modules", res.text)
        return Gdr()
    found = [m for m in PEERMEM_MODULES if m in loaded]
    if not found and not res.text.endswith("\n"):
        # A cut-off list cannot prove a module is absent.
        conds.add("gdr", "Truncated", "/proc/modules: ends mid-line; absence not provable")
        return Gdr()
    return Gdr(enabled=bool(found), modules=found)
