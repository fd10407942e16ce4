"""NodeTopology -> the topology spec of docs/simulator.md (``nodes: 1``).

The spec is produced only when every key is known; otherwise ``spec`` is
``None`` and ``spec_unknown`` lists the keys that are missing. Extra keys
(allowed by the contract): ``node_gpus`` (GPUs on the node, when this
container sees fewer) and ``gdr``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from dynamiccl.api.node_topology import NodeTopology
from dynamiccl.api.topology import TopologySpec
from dynamiccl.node_agent.conditions import Conditions


def _gpu_model(topo: NodeTopology, conds: Conditions) -> str | None:
    models = {g.model for g in topo.gpus if g.visible}
    if None in models or not models:
        return None
    if len(models) > 1:
        conds.add("spec.gpu", "MixedModels", f"visible GPUs are {sorted(str(m) for m in models)}")
        return None
    return models.pop()


def build(topo: NodeTopology, conds: Conditions) -> tuple[TopologySpec | None, list[str]]:
    """The spec and the keys that stayed unknown."""
    visible = [g for g in topo.gpus if g.visible]
    gpus_known = bool(topo.gpus) and all(g.visible is not None for g in topo.gpus)
    values: dict[str, Any] = {
        "name": topo.node_name,
        "gpu": _gpu_model(topo, conds),
        "gpus_per_node": len(visible) if gpus_known and visible else None,
        "nodes": 1,
        "intra": topo.intra,
        "nvlink_GBps": topo.nvlink_gbps,
        "nvls": topo.nvls,
        "pcie_gen": topo.pcie_gen,
        "nics_per_node": topo.nics_per_node,
        "nic_Gbps": topo.nic_gbps,
        "fabric": topo.fabric,
        "sharp": topo.sharp.capable,
    }
    unknown = [k for k, v in values.items() if v is None]
    if unknown:
        return None, unknown
    if topo.container.boundary and topo.container.gpus_on_node is not None:
        values["node_gpus"] = topo.container.gpus_on_node
    if topo.gdr.enabled is not None:
        values["gdr"] = topo.gdr.enabled
    try:
        return TopologySpec.model_validate(values), []
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(spec)"
        conds.add(f"spec.{where}", "Inconsistent", str(first["msg"]))
        return None, [where]
