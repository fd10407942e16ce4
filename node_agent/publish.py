"""What to write to Kubernetes, as a pure function of what is there and what was found.

``plan`` compares the desired NodeTopology status and node labels with the
current ones and returns the minimal writes: nothing when they already match.
Only DynamICCL's own label keys are ever touched; a label whose value is
unknown is removed rather than set to a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from dynamiccl.api import node_topology as nt
from dynamiccl.api.node_topology import NodeTopology
from dynamiccl.constants import (
    NODE_LABEL_FABRIC,
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_NIC_GBPS,
    NODE_LABEL_NVLINK,
    NODE_LABEL_NVLINK_CLIQUE,
    NODE_LABEL_NVLS,
    NODE_LABEL_NVSWITCH,
    NODE_LABEL_SHARP,
    NODE_LABEL_SHARP_OVERRIDE,
)

OWNED_LABELS: Final = (
    NODE_LABEL_NVLINK,
    NODE_LABEL_NVSWITCH,
    NODE_LABEL_NVLS,
    NODE_LABEL_FABRIC,
    NODE_LABEL_NIC_GBPS,
    NODE_LABEL_SHARP,
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_NVLINK_CLIQUE,
)
_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]")


def _bool(v: bool | None) -> str | None:
    return None if v is None else ("true" if v else "false")


def _number(v: float | None) -> str | None:
    if v is None:
        return None
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _label_value(text: str | None) -> str | None:
    if not text:
        return None
    value = _LABEL_BAD.sub("-", text)[:63].strip("-._")
    return value or None


def desired_labels(topo: NodeTopology) -> dict[str, str]:
    """Node labels for the known facts (unknown facts have no label)."""
    spec = topo.spec
    visible = [g for g in topo.gpus if g.visible]
    models = {g.model for g in visible}
    cliques = {
        f"{g.fabric.cluster_uuid}.{g.fabric.clique_id}"
        for g in visible
        if g.fabric and g.fabric.cluster_uuid and g.fabric.clique_id is not None
    }
    values: dict[str, str | None] = {
        NODE_LABEL_NVLINK: _bool(None if topo.intra is None else topo.intra.value != "pcie"),
        NODE_LABEL_NVSWITCH: _bool(topo.nvswitch),
        NODE_LABEL_NVLS: _bool(topo.nvls),
        NODE_LABEL_FABRIC: topo.fabric.value if topo.fabric else None,
        NODE_LABEL_NIC_GBPS: _number(topo.nic_gbps),
        NODE_LABEL_SHARP: _bool(topo.sharp.capable),
        NODE_LABEL_GPU_PRODUCT: _label_value(
            spec.gpu if spec else (models.pop() if len(models) == 1 else None)
        ),
        NODE_LABEL_NVLINK_CLIQUE: _label_value(cliques.pop()) if len(cliques) == 1 else None,
    }
    return {k: v for k, v in values.items() if v is not None}


def label_patch(current: dict[str, str], desired: dict[str, str]) -> dict[str, str | None] | None:
    """``metadata.labels`` merge-patch for our keys, ``None`` when nothing changes."""
    patch: dict[str, str | None] = {}
    for key in OWNED_LABELS:
        want = desired.get(key)
        if current.get(key) != want:
            patch[key] = want
    return patch or None


def sharp_override(labels: dict[str, str]) -> bool | None:
    """The admin's SHARP override from the node's labels."""
    value = labels.get(NODE_LABEL_SHARP_OVERRIDE, "").strip().lower()
    return {"true": True, "false": False}.get(value)


def _norm(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _norm(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_norm(v) for v in obj]
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    return obj


@dataclass(frozen=True)
class Plan:
    """The writes one publish round needs (all ``None`` = zero writes)."""

    create: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    labels: dict[str, str | None] | None = None

    @property
    def writes(self) -> int:
        return sum(x is not None for x in (self.create, self.status, self.labels))


def plan(
    topo: NodeTopology,
    current_cr: dict[str, Any] | None,
    current_labels: dict[str, str] | None,
) -> Plan:
    """Minimal writes to make the cluster show ``topo`` (labels only if the Node exists)."""
    status = topo.wire()
    create = None
    status_patch = None
    if current_cr is None:
        create = nt.custom_resource(topo.node_name)
        status_patch = status
    elif _norm(current_cr.get("status")) != _norm(status):
        status_patch = status
    labels = None
    if current_labels is not None:
        labels = label_patch(current_labels, desired_labels(topo))
    return Plan(create=create, status=status_patch, labels=labels)
