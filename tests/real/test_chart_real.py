"""`helm install charts/dynamiccl` on the real node, under Pod Security `restricted`.

The operator (with its webhook), the ingest and the node agent run as real
containers from the images `make images` built. The release namespace enforces
the `restricted` level; the node agent, which reads the host's /sys and /proc
through hostPath volumes (refused by `baseline` and `restricted`), runs in a
namespace of its own that allows it (chart value nodeAgent.namespace). The node
agent publishes the real node's NodeTopology (no GPU on this machine) and must
not crash-loop. The install is the session's shared one (conftest `release`).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from dynamiccl.testing.real_manifests import NODE_NAME
from tests.real.conftest import RealCluster, Release, _cache_dir, wait_until

pytestmark = [pytest.mark.real]


def _restarts(pods: Any) -> dict[str, int]:
    return {
        p.metadata.name: sum(s.restart_count for s in (p.status.container_statuses or []))
        for p in pods.items
    }


def test_chart_runs_on_the_real_node_under_restricted(
    real_cluster: RealCluster, release: Release
) -> None:
    core: Any = real_cluster.core()
    custom: Any = real_cluster.custom()
    ns, agent_ns = release.namespace, release.agent_namespace
    all_ready_s = max(release.ready_s.values())

    def topology() -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = custom.get_cluster_custom_object(
                "dynamiccl.io", "v1alpha1", "nodetopologies", NODE_NAME
            )
        except ApiException:
            return None
        return obj

    start = time.monotonic()
    wait_until("NodeTopology real-node-0", lambda: topology() is not None, 120)
    topo_s = all_ready_s + time.monotonic() - start
    out = _cache_dir() / "logs" / "real-tier-chart.json"
    out.write_text(
        json.dumps(
            {"helm_install_to_all_ready_s": all_ready_s, "ready_s": release.ready_s}
            | {"to_node_topology_s_at_most": topo_s}
        )
    )
    ready = {k: round(v, 1) for k, v in release.ready_s.items()}
    print(f"\nhelm install -> Ready (s): {ready}; NodeTopology: <= {topo_s:.1f} s")

    # everything runs on the real node; nothing restarted: the node agent does not crash-loop
    # and the ingest does not exit before its serving certificate exists
    time.sleep(max(0.0, 20 - (time.monotonic() - start)))
    restarts: dict[str, int] = {}
    for name in (ns, agent_ns):
        pods = core.list_namespaced_pod(name, label_selector="app.kubernetes.io/instance=dynamiccl")
        assert pods.items, name
        for p in pods.items:
            assert p.spec.node_name == NODE_NAME, p.metadata.name
            assert p.status.phase == "Running", (p.metadata.name, p.status.phase)
        restarts |= _restarts(pods)
    print(f"restarts: {restarts}")
    assert restarts, "no pods of the release"
    assert set(restarts.values()) == {0}, restarts
    topo = topology() or {}
    print(f"NodeTopology {NODE_NAME}: {json.dumps(topo.get('status', {}))[:800]}")
    assert topo.get("spec") or topo.get("status"), "the node agent published an empty NodeTopology"
