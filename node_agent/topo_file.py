"""Which nodes get an NCCL topology file (``NCCL_TOPO_FILE``), and the file itself.

The node agent publishes the file in its NodeTopology's status (``ncclTopoFile``); the
operator copies the files of the cluster's nodes into each tuned job's ConfigMap and the
webhook points the job's containers at their node's (docs/admin-guide.md, 'Topology
files').

Modes (the chart's ``nodeAgent.ncclTopoFile``):

- ``off``: no file;
- ``always``: every node publishes its file;
- ``auto``: a node publishes its file where discovery shows that NCCL's own detection in a
  pod depends on what the node hides. The one such fact discovery can tell is NVLinks that
  end at NVSwitches which are not on the node's PCI bus (VMs such as AWS p5 hide them; a
  GB200 tray's switches are in the rack): the file names those links' far end as an
  NVSwitch. Facts the host does not show (a VM's physical PCIe layout behind flat virtual
  root ports) the node agent cannot know either: the file omits unknowns, never guesses.
"""

from __future__ import annotations

from enum import StrEnum

from dynamiccl.api.node_topology import NcclTopoFile, NodeTopology, NvLinkRemote
from dynamiccl.node_agent import nccl_xml
from dynamiccl.node_agent.discover import Discovery


class Mode(StrEnum):
    """When a node publishes its topology file."""

    OFF = "off"
    AUTO = "auto"
    ALWAYS = "always"


def hidden_nvswitch_gpus(topo: NodeTopology) -> list[str]:
    """Bus ids of GPUs with NVLinks to NVSwitches that are not on the node's PCI bus."""
    visible = {s.bus_id for s in topo.nvswitches}
    return [
        g.bus_id
        for g in topo.gpus
        if any(
            p.remote is NvLinkRemote.NVSWITCH and (p.remote_bus_id or "") not in visible
            for p in g.nvlink_peers
        )
    ]


def reason(topo: NodeTopology, mode: Mode) -> str | None:
    """Why this node publishes a file in ``mode`` (``None``: it publishes none)."""
    if mode is Mode.OFF:
        return None
    hidden = hidden_nvswitch_gpus(topo)
    if hidden:
        return f"NVLinks of {len(hidden)} GPU(s) end at NVSwitches not on the PCI bus"
    return "always (chart value)" if mode is Mode.ALWAYS else None


def with_file(disc: Discovery, mode: Mode) -> NodeTopology:
    """The discovered topology, with its topology file where ``mode`` asks for one."""
    why = reason(disc.topology, mode)
    if why is None:
        return disc.topology
    xml = nccl_xml.render(disc, named=False)
    return disc.topology.model_copy(update={"nccl_topo_file": NcclTopoFile(reason=why, xml=xml)})
