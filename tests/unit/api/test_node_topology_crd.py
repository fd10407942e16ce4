"""The generated CRD is a Kubernetes structural schema, and real discoveries fit it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dynamiccl.api.node_topology_crd import node_topology_crd
from dynamiccl.node_agent.discover import discover
from dynamiccl.node_agent.hostroot import HostRoot

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
FORBIDDEN = {"$ref", "$defs", "anyOf", "allOf", "oneOf", "title", "default", "additionalProperties"}


def schema() -> dict[str, Any]:
    crd = node_topology_crd()
    out: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return out


def nodes(s: Any) -> list[dict[str, Any]]:
    if not isinstance(s, dict):
        return []
    out = [s]
    for v in s.get("properties", {}).values():
        out += nodes(v)
    out += nodes(s.get("items"))
    return out


def test_structural() -> None:
    for n in nodes(schema()):
        assert not FORBIDDEN & set(n), sorted(FORBIDDEN & set(n))
        assert "type" in n, n
        if "properties" in n:
            assert n["type"] == "object"
    crd = node_topology_crd()
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    assert yaml.safe_load(yaml.safe_dump(crd)) == crd


def validate(value: Any, s: dict[str, Any], where: str = "", *, prune_nulls: bool = False) -> None:
    """The subset of OpenAPI v3 the CRD uses, as the API server applies it."""
    if value is None:
        # Without nullable the server prunes a null (unknown = absent).
        assert prune_nulls or s.get("nullable"), f"{where}: null not allowed"
        return
    kind = s["type"]
    checks = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}
    if kind == "number":
        assert isinstance(value, int | float), where
        assert not isinstance(value, bool), where
    else:
        assert isinstance(value, checks[kind]), f"{where}: {value!r} is not {kind}"
    if "enum" in s:
        assert value in s["enum"], where
    if "pattern" in s:
        assert re.search(s["pattern"], value), where
    if "minimum" in s:
        assert value >= s["minimum"], where
    if kind == "object":
        props = s.get("properties", {})
        for k in s.get("required", []):
            assert value.get(k) is not None, f"{where}.{k} required"
        for k, v in value.items():
            if k in props:
                validate(v, props[k], f"{where}.{k}", prune_nulls=prune_nulls)
            else:
                assert s.get("x-kubernetes-preserve-unknown-fields"), f"{where}.{k} pruned"
    if kind == "array":
        for i, v in enumerate(value):
            validate(v, s["items"], f"{where}[{i}]", prune_nulls=prune_nulls)


@pytest.mark.parametrize(
    "layout",
    sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and not p.name.startswith("_")),
)
def test_every_fixture_status_fits(layout: str) -> None:
    status = discover(HostRoot(FIXTURES / layout)).topology.wire()
    validate(status, schema()["properties"]["status"], "status")


COMMITTED = Path(__file__).resolve().parents[3] / "crds" / "dynamiccl.io_nodetopologies.yaml"


@pytest.mark.skipif(not COMMITTED.is_file(), reason="crds/ not generated yet")
@pytest.mark.parametrize("layout", ["dgx-h100", "container-2of8", "gb200-nvl72-tray"])
def test_the_committed_crd_accepts_every_status(layout: str) -> None:
    crd = yaml.safe_load(COMMITTED.read_text())
    committed = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    status = discover(HostRoot(FIXTURES / layout)).topology.wire()
    validate(status, committed["properties"]["status"], "status", prune_nulls=True)
    ours = schema()["properties"]["status"]["properties"]
    assert set(committed["properties"]["status"]["properties"]) == set(ours)
