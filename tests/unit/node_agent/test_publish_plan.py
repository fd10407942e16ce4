"""publish.plan: the minimal writes, and none when nothing changed."""

from __future__ import annotations

import copy
import json
from typing import Any

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
from dynamiccl.node_agent import publish
from dynamiccl.node_agent.discover import discover
from dynamiccl.node_agent.hostroot import HostRoot


def topo(root: Any, name: str = "node-a") -> NodeTopology:
    return discover(HostRoot(root), name=name).topology


def test_labels_for_each_layout(fixture_root: Any) -> None:
    assert publish.desired_labels(topo(fixture_root("dgx-h100"))) == {
        NODE_LABEL_NVLINK: "true",
        NODE_LABEL_NVSWITCH: "true",
        NODE_LABEL_NVLS: "true",
        NODE_LABEL_FABRIC: "infiniband",
        NODE_LABEL_NIC_GBPS: "400",
        NODE_LABEL_SHARP: "false",
        NODE_LABEL_GPU_PRODUCT: "H100",
    }
    l40s = publish.desired_labels(topo(fixture_root("pcie-l40s")))
    assert (l40s[NODE_LABEL_NVLINK], l40s[NODE_LABEL_NVSWITCH], l40s[NODE_LABEL_FABRIC]) == (
        "false",
        "false",
        "ethernet",
    )
    gb = publish.desired_labels(topo(fixture_root("gb200-nvl72-tray")))
    assert gb[NODE_LABEL_NVLINK_CLIQUE] == "3c5d8f21-7a4e-4b9c-9e2f-6a1b2c3d4e5f.32766"


def test_unknown_facts_have_no_label(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    for f in (root / ".dynamiccl-recorded").iterdir():
        f.unlink()
    labels = publish.desired_labels(topo(root))
    assert NODE_LABEL_NVLINK not in labels
    assert NODE_LABEL_NVLS not in labels
    assert labels[NODE_LABEL_NVSWITCH] == "true"  # NVSwitches are on PCI
    assert labels[NODE_LABEL_GPU_PRODUCT] == "H100"


def test_first_publish_creates_then_nothing(fixture_root: Any) -> None:
    t = topo(fixture_root("dgx-a100"))
    first = publish.plan(t, None, {"kubernetes.io/hostname": "node-a"})
    assert first.writes == 3
    assert first.create is not None
    assert first.create["metadata"]["name"] == "node-a"
    assert first.create["kind"] == "NodeTopology"
    assert first.status == t.wire()
    # The server stores JSON: ints for whole floats, nulls kept or dropped.
    stored = json.loads(json.dumps(first.status).replace("400.0", "400"))
    labels = {"kubernetes.io/hostname": "node-a", **publish.desired_labels(t)}
    again = publish.plan(t, {"status": stored}, labels)
    assert again.writes == 0


def test_only_our_labels_are_touched_and_stale_ones_removed(fixture_root: Any) -> None:
    t = topo(fixture_root("pcie-l40s"))
    current = {
        "kubernetes.io/hostname": "node-a",
        "nvidia.com/gpu.product": "NVIDIA-L40S",
        NODE_LABEL_NVLINK_CLIQUE: "old.1",
        NODE_LABEL_FABRIC: "infiniband",
    }
    patch = publish.label_patch(current, publish.desired_labels(t))
    assert patch is not None
    assert patch[NODE_LABEL_NVLINK_CLIQUE] is None
    assert patch[NODE_LABEL_FABRIC] == "ethernet"
    assert not {"kubernetes.io/hostname", "nvidia.com/gpu.product"} & set(patch)


def test_changed_status_is_replaced(fixture_root: Any) -> None:
    t = topo(fixture_root("dgx-h100"))
    stale = copy.deepcopy(t.wire())
    stale["nicsPerNode"] = 7
    stale["spec"]["gone_extra_key"] = 1
    p = publish.plan(t, {"status": stale}, None)
    assert p.create is None
    assert p.labels is None
    assert p.status == t.wire()


def test_sharp_override_label() -> None:
    assert publish.sharp_override({NODE_LABEL_SHARP_OVERRIDE: "true"}) is True
    assert publish.sharp_override({NODE_LABEL_SHARP_OVERRIDE: "False"}) is False
    assert publish.sharp_override({NODE_LABEL_SHARP_OVERRIDE: "maybe"}) is None
    assert publish.sharp_override({}) is None
