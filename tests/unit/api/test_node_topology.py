"""The NodeTopology model: camelCase wire form, strictness, the CR body."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dynamiccl.api import node_topology as nt


def test_wire_names_are_camel_case_and_spec_keeps_contract_keys() -> None:
    topo = nt.NodeTopology(node_name="n1", nic_gbps=400.0, nics_per_node=8)
    wire = topo.wire()
    assert wire["nodeName"] == "n1"
    assert wire["nicGbps"] == 400.0
    assert wire["nicsPerNode"] == 8
    assert nt.NodeTopology.model_validate(wire) == topo


def test_unknown_keys_and_bad_bus_ids_are_rejected() -> None:
    with pytest.raises(ValidationError):
        nt.NodeTopology.model_validate({"nodeName": "n", "surprise": 1})
    with pytest.raises(ValidationError):
        nt.Gpu(bus_id="18:00.0")


def test_custom_resource_shape() -> None:
    body = nt.custom_resource("gpu-7", nt.NodeTopology(node_name="gpu-7"))
    assert body["apiVersion"] == "dynamiccl.io/v1alpha1"
    assert body["kind"] == "NodeTopology"
    assert body["metadata"]["name"] == "gpu-7"
    assert body["spec"] == {"nodeName": "gpu-7"}
    assert body["status"]["nodeName"] == "gpu-7"
    assert "status" not in nt.custom_resource("gpu-7")
