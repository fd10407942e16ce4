"""The intra-node interconnect of the GPUs this container can use.

* ``nvswitch``: every visible GPU's active NVLinks go to NVSwitches;
* ``nvlink``: every visible GPU pair is joined by direct NVLinks;
* ``pcie``: some visible GPU (or pair) has no NVLink path.

NVLS (NVLink SHARP) needs NVSwitch and Hopper or newer GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamiccl.api.node_topology import Gpu, NvLinkMatrix, NvLinkRemote
from dynamiccl.api.topology import Intra
from dynamiccl.node_agent.conditions import Conditions


@dataclass(frozen=True)
class Interconnect:
    """Intra-node facts (``None`` = unknown)."""

    intra: Intra | None
    nvlink_gbps: float | None
    nvswitch: bool | None
    nvls: bool | None
    pcie_gen: int | None
    matrix: NvLinkMatrix


def _switch_links(g: Gpu) -> int:
    return sum(p.links for p in g.nvlink_peers if p.remote is NvLinkRemote.NVSWITCH)


def _direct(a: Gpu, b: Gpu) -> int:
    return sum(
        p.links
        for p in a.nvlink_peers
        if p.remote is not NvLinkRemote.NVSWITCH and p.remote_bus_id == b.bus_id
    )


def _pair(a: Gpu, b: Gpu) -> int:
    if a.bus_id == b.bus_id:
        return 0
    through_switch = min(_switch_links(a), _switch_links(b))
    return through_switch + _direct(a, b)


def _kind(g: Gpu) -> str | None:
    if g.nvlink_links is None:
        return None
    if g.nvlink_links == 0:
        return "none"
    remotes = {p.remote for p in g.nvlink_peers}
    if NvLinkRemote.UNKNOWN in remotes or not remotes:
        return None
    return "switch" if remotes == {NvLinkRemote.NVSWITCH} else "direct"


def _intra(visible: list[Gpu], conds: Conditions) -> Intra | None:
    kinds = [_kind(g) for g in visible]
    if any(k is None for k in kinds):
        unknown = [g.bus_id for g, k in zip(visible, kinds, strict=True) if k is None]
        conds.add("intra", "Unknown", f"NVLink peers unknown for GPUs {unknown}")
        return None
    if len(visible) == 1:
        # One GPU: nothing to interconnect; report what its links reach.
        return {"switch": Intra.NVSWITCH, "direct": Intra.NVLINK}.get(kinds[0] or "", Intra.PCIE)
    if "none" in kinds:
        return Intra.PCIE
    if all(k == "switch" for k in kinds):
        return Intra.NVSWITCH
    for i, a in enumerate(visible):
        for b in visible[i + 1 :]:
            if _pair(a, b) == 0:
                conds.add(
                    "intra", "PartialNvlink", f"{a.bus_id} and {b.bus_id} share no NVLink: pcie"
                )
                return Intra.PCIE
    return Intra.NVLINK


def analyse(gpus: list[Gpu], nvswitches_on_pci: int, conds: Conditions) -> Interconnect:
    """Intra-node interconnect of the visible GPUs."""
    visible = [g for g in gpus if g.visible]
    matrix = NvLinkMatrix(
        gpus=[g.bus_id for g in visible],
        links=[[_pair(a, b) for b in visible] for a in visible],
    )
    if not visible:
        conds.add("intra", "NoGpus", "no GPU visible to this container")
        return Interconnect(None, None, None, None, None, matrix)
    intra = _intra(visible, conds)
    gbps: float | None = None
    if intra is Intra.PCIE:
        gbps = 0.0
    elif intra is not None:
        per_gpu = [g.nvlink_gbps for g in visible]
        if all(v is not None for v in per_gpu):
            gbps = min(v for v in per_gpu if v is not None)
    nvswitch: bool | None
    if intra is Intra.NVSWITCH or nvswitches_on_pci > 0:
        nvswitch = True
    elif intra is not None:
        nvswitch = False
    else:
        nvswitch = None
    nvls: bool | None = None
    sms = [g.compute_capability for g in visible]
    if intra is not None and intra is not Intra.NVSWITCH:
        nvls = False
    elif intra is Intra.NVSWITCH and all(s is not None for s in sms):
        nvls = all(float(s) >= 9.0 for s in sms if s is not None)
    gens = [g.pcie.gen for g in visible]
    pcie_gen = min(x for x in gens if x is not None) if all(x is not None for x in gens) else None
    if pcie_gen is None:
        conds.add("pcieGen", "Unknown", "a visible GPU's PCIe link capability is unknown")
    return Interconnect(intra, gbps, nvswitch, nvls, pcie_gen, matrix)
