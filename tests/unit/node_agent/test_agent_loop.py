"""The agent loop against an in-memory TopologyApi (our adapter layer): writes only on change."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from dynamiccl.constants import NODE_LABEL_NIC_GBPS, NODE_LABEL_SHARP, NODE_LABEL_SHARP_OVERRIDE
from dynamiccl.node_agent.agent_loop import AgentLoop
from dynamiccl.node_agent.hostroot import HostRoot
from dynamiccl.node_agent.kube import KubeError


class MemoryApi:
    """Stores objects like the API server would (JSON round trip) and counts every call."""

    def __init__(self, node: str) -> None:
        self.labels: dict[str, dict[str, str]] = {node: {"kubernetes.io/hostname": node}}
        self.objects: dict[str, dict[str, Any]] = {}
        self.reads = 0
        self.writes = 0
        self.fail_writes = False

    def _write(self) -> None:
        if self.fail_writes:
            raise KubeError("patch: HTTP 503 Service Unavailable")
        self.writes += 1

    def get_node_labels(self, name: str) -> dict[str, str] | None:
        self.reads += 1
        return dict(self.labels[name]) if name in self.labels else None

    def get_topology(self, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return copy.deepcopy(self.objects.get(name))

    def create_topology(self, body: dict[str, Any]) -> None:
        self._write()
        obj = json.loads(json.dumps(body))
        obj.pop("status", None)  # status is a subresource
        self.objects[body["metadata"]["name"]] = obj

    def replace_topology_status(self, name: str, status: dict[str, Any]) -> None:
        self._write()
        self.objects[name]["status"] = json.loads(json.dumps(status))

    def patch_node_labels(self, name: str, labels: dict[str, str | None]) -> None:
        self._write()
        for k, v in labels.items():
            if v is None:
                self.labels[name].pop(k, None)
            else:
                self.labels[name][k] = v


def loop_for(root: Path, api: MemoryApi, **kw: Any) -> AgentLoop:
    return AgentLoop(api=api, host=HostRoot(root), node_name="gpu-1", **kw)


def test_steady_state_makes_zero_writes(fixture_root: Any) -> None:
    api = MemoryApi("gpu-1")
    loop = loop_for(fixture_root("dgx-h100"), api)
    first = loop.round()
    assert (first.writes, api.writes) == (3, 3)
    for _ in range(20):
        assert loop.round().writes == 0
    assert api.writes == 3
    assert api.objects["gpu-1"]["status"]["spec"]["gpus_per_node"] == 8
    assert api.labels["gpu-1"][NODE_LABEL_NIC_GBPS] == "400"


def test_a_change_is_published_once_it_is_stable(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    api = MemoryApi("gpu-1")
    loop = loop_for(root, api, stable_rounds=2)
    loop.round()
    rate = root / "sys/class/infiniband/mlx5_0/ports/1/rate"
    rate.write_text("200 Gb/sec (4X HDR)\n")
    assert loop.round().pending is True  # seen once: not yet
    r = loop.round()
    assert r.writes == 2
    assert api.labels["gpu-1"][NODE_LABEL_NIC_GBPS] == "200"
    assert api.objects["gpu-1"]["status"]["nicGbps"] == 200


def test_a_flapping_port_changes_nothing(host_copy: Any) -> None:
    root = host_copy("dgx-h100")
    api = MemoryApi("gpu-1")
    loop = loop_for(root, api, stable_rounds=2)
    loop.round()
    state = root / "sys/class/infiniband/mlx5_3/ports/1/state"
    for i in range(10):
        state.write_text("1: DOWN\n" if i % 2 == 0 else "4: ACTIVE\n")
        loop.round()
    assert api.writes == 3
    assert api.objects["gpu-1"]["status"]["nicsPerNode"] == 8


def test_external_edits_are_repaired(fixture_root: Any) -> None:
    api = MemoryApi("gpu-1")
    loop = loop_for(fixture_root("pcie-l40s"), api)
    loop.round()
    api.labels["gpu-1"][NODE_LABEL_SHARP] = "true"
    api.objects["gpu-1"]["status"]["fabric"] = "infiniband"
    r = loop.round()
    assert r.writes == 2
    assert api.labels["gpu-1"][NODE_LABEL_SHARP] == "false"
    assert api.objects["gpu-1"]["status"]["fabric"] == "ethernet"


def test_admin_sharp_override_label_is_honoured(fixture_root: Any) -> None:
    api = MemoryApi("gpu-1")
    api.labels["gpu-1"][NODE_LABEL_SHARP_OVERRIDE] = "true"
    loop = loop_for(fixture_root("dgx-h100"), api, stable_rounds=1)
    loop.round()
    assert api.labels["gpu-1"][NODE_LABEL_SHARP] == "true"
    assert api.objects["gpu-1"]["status"]["sharp"]["override"] is True


def test_api_errors_are_reported_and_retried(fixture_root: Any) -> None:
    api = MemoryApi("gpu-1")
    api.fail_writes = True
    loop = loop_for(fixture_root("dgx-h100"), api)
    r = loop.round()
    assert r.error is not None
    assert "503" in r.error
    assert api.writes == 0
    api.fail_writes = False
    assert loop.round().writes == 3


def test_node_missing_publishes_the_cr_only(fixture_root: Any) -> None:
    api = MemoryApi("other")
    loop = loop_for(fixture_root("dgx-h100"), api)
    assert loop.round().writes == 2
    assert "gpu-1" in api.objects


def test_nccl_xml_is_written_only_on_change(fixture_root: Any, tmp_path: Path) -> None:
    api = MemoryApi("gpu-1")
    out = tmp_path / "topo" / "nccl-topo.xml"
    loop = loop_for(fixture_root("dgx-a100"), api, nccl_xml_path=out)
    loop.round()
    first = out.stat().st_mtime_ns
    assert out.read_text().startswith('<system version="1"')
    loop.round()
    assert out.stat().st_mtime_ns == first
