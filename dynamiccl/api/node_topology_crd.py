"""The NodeTopology CustomResourceDefinition, generated from the pydantic model.

A small, self-contained pydantic-JSON-schema -> Kubernetes structural-schema
conversion (refs inlined, ``anyOf [X, null]`` -> ``nullable``, titles and
defaults dropped). The operator's CRD generator may replace this once it
covers NodeTopology; until then the node agent's integration test applies it.
"""

from __future__ import annotations

from typing import Any

from dynamiccl.api import node_topology as nt
from dynamiccl.constants import API_VERSION, GROUP

_DROP = frozenset({"title", "default", "additionalProperties", "$defs"})


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        extra = {k: v for k, v in node.items() if k not in ("$ref", *_DROP)}
        return _structural({**target, **extra}, defs)
    any_of = node.get("anyOf")
    if isinstance(any_of, list):
        kinds = [x for x in any_of if x != {"type": "null"}]
        if len(kinds) == 1 and len(kinds) < len(any_of):
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            merged = _structural({**kinds[0], **rest}, defs)
            merged["nullable"] = True
            return merged
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        else:
            out[key] = _structural(value, defs)
    if node.get("additionalProperties") is True:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def structural_schema(model: type[Any]) -> dict[str, Any]:
    """The model's JSON schema (wire names) as a Kubernetes structural schema."""
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    result: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    return result


def node_topology_crd() -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CRD for NodeTopology (cluster-scoped, status subresource)."""
    status = structural_schema(nt.NodeTopology)
    spec = structural_schema(nt.NodeTopologySpec)
    columns = [
        ("GPU", "string", ".status.spec.gpu"),
        ("GPUs", "integer", ".status.spec.gpus_per_node"),
        ("Intra", "string", ".status.intra"),
        ("Fabric", "string", ".status.fabric"),
        ("NICs", "integer", ".status.nicsPerNode"),
        ("Gbps", "number", ".status.nicGbps"),
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{nt.PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": nt.KIND,
                "plural": nt.PLURAL,
                "singular": nt.SINGULAR,
                "listKind": f"{nt.KIND}List",
                "shortNames": list(nt.SHORT_NAMES),
                "categories": ["dynamiccl"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": n, "type": t, "jsonPath": p} for n, t, p in columns
                    ]
                    + [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": nt.NodeTopology.__doc__ or "",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }
