"""Node agents publishing to a REAL kube-apiserver (kwok nodes).

Three node agents, each reading a different host fixture, publish NodeTopology
objects and node labels for three kwok nodes created by the test. A changed
fixture updates the published state; unchanged fixtures cause zero writes,
counted three ways: at our adapter layer (a counting wrapper around the real
KubeAdapter), by the objects' resourceVersions / label managedFields, and by
the apiserver's own ``apiserver_request_total`` for nodetopologies.

Cluster: the ``cluster`` fixture of conftest.py, on tests/integration/conftest.py's
(started if none is reachable; never skipped).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from dynamiccl.api import node_topology as nt
from dynamiccl.constants import API_VERSION, GROUP, NODE_LABEL_NIC_GBPS
from dynamiccl.node_agent import publish
from dynamiccl.node_agent.agent_loop import AgentLoop
from dynamiccl.node_agent.discover import discover
from dynamiccl.node_agent.hostroot import HostRoot
from dynamiccl.node_agent.kube import KubeAdapter

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "hosts"
LAYOUTS = ("dgx-h100", "aws-p5", "pcie-l40s")
WRITES = ("create_topology", "replace_topology_status", "patch_node_labels")


class Counting:
    """Our adapter with every call counted (the wrapper layer the agent talks to)."""

    def __init__(self, inner: KubeAdapter) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.inner, name)

        def counted(*args: Any, **kw: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args, **kw)

        return counted

    @property
    def writes(self) -> int:
        return sum(self.calls.get(w, 0) for w in WRITES)


def _metric_writes(api: k8s.ApiClient) -> int:
    """apiserver_request_total for write verbs on nodetopologies (all of them, cluster-wide)."""
    method, url, headers, body, _ = api.param_serialize(
        "GET", "/metrics", auth_settings=["BearerToken"]
    )
    resp = api.call_api(method, url, header_params=headers, body=body)
    data = resp.read()  # type: ignore[no-untyped-call]  # RESTResponse.read is unannotated
    text = data.decode()
    total = 0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="nodetopologies"' in line:
            verb = re.search(r'verb="([A-Z]+)"', line)
            if verb and verb.group(1) in ("CREATE", "PATCH", "UPDATE", "APPLY"):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def _label_update_times(core: k8s.CoreV1Api, name: str) -> list[str]:
    node = core.read_node(name)
    assert node.metadata is not None
    return sorted(
        str(m.time)
        for m in node.metadata.managed_fields or []
        if "f:labels" in str(m.fields_v1 or {}) and m.operation == "Update"
    )


def test_agents_publish_update_and_then_stay_quiet(cluster: dict[str, Any], tmp_path: Path) -> None:
    core, custom, names = cluster["core"], cluster["custom"], cluster["nodes"]
    roots = {}
    agents: list[tuple[AgentLoop, Counting]] = []
    for name, layout in zip(names, LAYOUTS, strict=True):
        roots[name] = tmp_path / name
        shutil.copytree(FIXTURES / layout, roots[name], symlinks=True)
        adapter = Counting(KubeAdapter(cluster["kubeconfig"]))
        agents.append((AgentLoop(api=adapter, host=HostRoot(roots[name]), node_name=name), adapter))

    # 1. First round: every node gets its NodeTopology and labels.
    for loop, _ in agents:
        r = loop.round()
        assert r.error is None
        assert r.writes == 3
    for name, layout in zip(names, LAYOUTS, strict=True):
        want = discover(HostRoot(roots[name]), name=name).topology
        obj = custom.get_cluster_custom_object(GROUP, API_VERSION, nt.PLURAL, name)
        assert obj["spec"] == {"nodeName": name}
        assert want.spec is not None
        assert obj["status"]["spec"] == want.spec.model_dump(mode="json"), layout
        assert obj["status"]["nicsPerNode"] == want.nics_per_node
        labels = core.read_node(name).metadata.labels
        assert {
            k: v for k, v in labels.items() if k.startswith(f"{GROUP}/")
        } == publish.desired_labels(want)
        assert labels["kubernetes.io/hostname"] == name  # others' labels untouched

    # 2. Steady state: no writes at all, however many rounds.
    versions = {
        n: custom.get_cluster_custom_object(GROUP, API_VERSION, nt.PLURAL, n)["metadata"][
            "resourceVersion"
        ]
        for n in names
    }
    label_times = {n: _label_update_times(core, n) for n in names}
    before = _metric_writes(cluster["api"])
    assert before >= 2 * len(names)  # the counter sees our creates and status patches
    counted = [a.writes for _, a in agents]
    for _ in range(5):
        for loop, _ in agents:
            r = loop.round()
            assert r.error is None
            assert r.writes == 0
    assert [a.writes for _, a in agents] == counted
    assert all(a.calls["get_topology"] == 6 and a.calls["get_node_labels"] == 6 for _, a in agents)
    for n in names:
        obj = custom.get_cluster_custom_object(GROUP, API_VERSION, nt.PLURAL, n)
        assert obj["metadata"]["resourceVersion"] == versions[n]
        assert _label_update_times(core, n) == label_times[n]
    assert _metric_writes(cluster["api"]) == before

    # 3. A changed host (the p5 loses 4 EFA links) is published once it is stable.
    p5_name = names[1]
    for port in sorted((roots[p5_name] / "sys/class/infiniband").iterdir())[:4]:
        (port / "ports/1/state").write_text("1: DOWN\n")
    p5_loop, _p5_api = agents[1]
    assert p5_loop.round().pending is True
    r = p5_loop.round()
    assert r.writes == 1  # status only: fabric, speed and labels are unchanged
    obj = custom.get_cluster_custom_object(GROUP, API_VERSION, nt.PLURAL, p5_name)
    assert obj["status"]["nicsPerNode"] == 28
    assert obj["status"]["spec"]["nics_per_node"] == 28
    assert p5_loop.round().writes == 0

    # A label-visible change on another node patches the labels.
    l40s_name = names[2]
    for nd in ("ens1f0np0", "ens1f1np1"):
        (roots[l40s_name] / f"sys/class/net/{nd}/speed").write_text("25000\n")
    loop, _ = agents[2]
    loop.round()
    assert loop.round().writes == 2
    assert core.read_node(l40s_name).metadata.labels[NODE_LABEL_NIC_GBPS] == "25"


def test_the_cli_agent_publishes_once(cluster: dict[str, Any], tmp_path: Path) -> None:
    name = cluster["nodes"][0]
    root = tmp_path / "host"
    shutil.copytree(FIXTURES / "gb200-nvl72-tray", root, symlinks=True)
    xml = tmp_path / "nccl-topo.xml"
    cmd = [
        sys.executable, "-m", "dynamiccl.cli", "node-agent", "--once", "--json",
        "--root", str(root), "--node-name", name, "--kubeconfig", cluster["kubeconfig"],
        "--stable-rounds", "1",
        "--nccl-xml", str(xml),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert '"error": null' in out.stdout.splitlines()[-1]
    obj = cluster["custom"].get_cluster_custom_object(GROUP, API_VERSION, nt.PLURAL, name)
    assert obj["status"]["spec"]["gpu"] == "GB200"
    assert xml.read_text().startswith("<system")
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert '"writes": 0' in again.stdout.splitlines()[-1]
