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
_MODULE_LINE = re.compile(
    r"([A-Za-z_][A-Za-z0-9_]*) [0-9]+ [0-9]+ (?:-|[A-Za-z0-9_,]+) "
    r"(?:Live|Loading|Unloading) 0x[0-9a-f]+(?: \([A-Z+-]+\))?"
)


def parse_modules(text: str) -> tuple[list[str], int]:
    """Loaded module names and the number of lines not in /proc/modules format."""
    names: list[str] = []
    bad = 0
    for line in text.splitlines():
        if not line:
            continue
        m = _MODULE_LINE.fullmatch(line)
        if m:
            names.append(m.group(1))
        else:
            bad += 1
    return names, bad


def scan(host: HostRoot, conds: Conditions) -> Gdr:
    """Peer-memory modules loaded on the host."""
    res = host.read("/proc/modules")
    if res.text is None:
        conds.unreadable("gdr", "/proc/modules", res.error)
        return Gdr()
    loaded, bad = parse_modules(res.text)
    found = [m for m in PEERMEM_MODULES if m in loaded]
    if not found and bad:
        # A garbled line may have been the peer-memory module.
        conds.garbled("gdr", "/proc/modules", res.text)
        return Gdr()
    if not found and not res.text.endswith("\n"):
        # A cut-off list cannot prove a module is absent.
        conds.add("gdr", "Truncated", "/proc/modules: ends mid-line; absence not provable")
        return Gdr()
    return Gdr(enabled=bool(found), modules=found)
