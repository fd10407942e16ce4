"""`helm install charts/dynamiccl` on the real node, under Pod Security `restricted`.

The operator (with its webhook), the ingest and the node agent run as real
containers from the images `make images` built. The release namespace enforces
the `restricted` level; the node agent, which reads the host's /sys and /proc
through hostPath volumes (refused by `baseline` and `restricted`), runs in a
namespace of its own that allows it (chart value nodeAgent.namespace). The node
agent publishes the real node's NodeTopology (no GPU on this machine) and must
not crash-loop.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.real.conftest import (
    NODE_LABEL,
    NODE_NAME,
    ON_REAL_NODE,
    RealCluster,
    _cache_dir,
    wait_until,
)

pytestmark = [pytest.mark.real]

RELEASE = "dynamiccl"
STORAGE_CLASS = "dynamiccl-real-local"
READY_TIMEOUT_S = 300


def _ns(name: str, level: str) -> dict[str, Any]:
    labels = {f"pod-security.kubernetes.io/{m}": level for m in ("enforce", "warn", "audit")}
    return {"metadata": {"name": name, "labels": labels}}


@pytest.fixture
def release(real_cluster: RealCluster) -> Iterator[tuple[str, str, Path]]:
    """A restricted release namespace, a privileged one for the node agent, a local PV."""
    core: Any = real_cluster.core()
    _delete_topology(real_cluster)  # one a previous release left must not count
    suffix = uuid.uuid4().hex[:6]
    ns, agent_ns = f"dcl-real-{suffix}", f"dcl-real-{suffix}-node"
    core.create_namespace(_ns(ns, "restricted"))
    core.create_namespace(_ns(agent_ns, "privileged"))
    volume = real_cluster.node_dir / "volumes" / ns
    volume.mkdir(parents=True)
    storage = k8s_storage(real_cluster)
    try:
        storage.create_storage_class(
            {
                "metadata": {"name": STORAGE_CLASS},
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "WaitForFirstConsumer",
            }
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    core.create_persistent_volume(
        {
            "metadata": {"name": f"{ns}-store"},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": STORAGE_CLASS,
                "claimRef": {"namespace": ns, "name": f"{RELEASE}-store"},
                "local": {"path": str(volume)},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": [NODE_NAME],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        }
    )
    try:
        yield ns, agent_ns, volume
    finally:
        real_cluster.helm_run("uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "120s")
        for name in (ns, agent_ns):
            core.delete_namespace(name)
        core.delete_persistent_volume(f"{ns}-store")
        _delete_topology(real_cluster)
        shutil.rmtree(volume, ignore_errors=True)


def _delete_topology(real_cluster: RealCluster) -> None:
    with contextlib.suppress(ApiException):
        real_cluster.custom().delete_cluster_custom_object(
            "dynamiccl.io", "v1alpha1", "nodetopologies", NODE_NAME
        )


def k8s_storage(real_cluster: RealCluster) -> Any:
    from kubernetes import client as k8s  # noqa: PLC0415

    return k8s.StorageV1Api(real_cluster.api)


def _values(real_cluster: RealCluster, agent_ns: str) -> dict[str, Any]:
    return {
        "image": {
            "repository": real_cluster.image_repository,
            "tag": real_cluster.image_tag,
            "pullPolicy": "Never",  # imported into containerd; there is no registry
        },
        "operator": {"replicas": 1, **ON_REAL_NODE},
        "ingest": dict(ON_REAL_NODE),
        "store": {"persistence": {"storageClass": STORAGE_CLASS}},
        "nodeAgent": {
            "namespace": agent_ns,
            # the real node is no GPU node: select it instead of GPU Feature Discovery's label
            "nodeSelector": {NODE_LABEL: "true", "nvidia.com/gpu.present": None},
        },
    }


def _diagnose(real_cluster: RealCluster, *namespaces: str) -> str:
    """Pod states and the last lines of each container's log (the kubelet's files)."""
    core: Any = real_cluster.core()
    lines: list[str] = []
    for ns in namespaces:
        for p in core.list_namespaced_pod(ns).items:
            states = [
                (s.name, s.restart_count, s.state, s.last_state)
                for s in p.status.container_statuses or []
            ]
            lines.append(f"{ns}/{p.metadata.name} {p.status.phase} {states}")
        for log in sorted((real_cluster.node_dir / "pod-logs").glob(f"{ns}_*/*/*.log")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            lines += [f"--- {log.parent.parent.name}/{log.parent.name}/{log.name}", *tail]
    return "\n".join(lines)


def _restarts(pods: Any) -> dict[str, int]:
    return {
        p.metadata.name: sum(s.restart_count for s in (p.status.container_statuses or []))
        for p in pods.items
    }


def test_chart_runs_on_the_real_node_under_restricted(
    real_cluster: RealCluster, release: tuple[str, str, Path]
) -> None:
    ns, agent_ns, _ = release
    apps: Any = real_cluster.apps()
    core: Any = real_cluster.core()
    custom: Any = real_cluster.custom()
    values = _cache_dir() / "logs" / f"real-values-{ns}.json"
    values.parent.mkdir(parents=True, exist_ok=True)
    values.write_text(json.dumps(_values(real_cluster, agent_ns)))

    start = time.monotonic()
    real_cluster.helm_run("install", RELEASE, "charts/dynamiccl", "-n", ns, "-f", str(values))

    def available(name: str) -> bool:
        d = apps.read_namespaced_deployment(name, ns)
        return (d.status.available_replicas or 0) >= (d.spec.replicas or 1)

    def agent_ready() -> bool:
        ds = apps.read_namespaced_daemon_set(f"{RELEASE}-node-agent", agent_ns)
        return bool(ds.status.desired_number_scheduled == 1 and ds.status.number_ready == 1)

    try:
        wait_until(
            "the operator Deployment", lambda: available(f"{RELEASE}-operator"), READY_TIMEOUT_S
        )
        wait_until("the ingest Deployment", lambda: available(f"{RELEASE}-ingest"), READY_TIMEOUT_S)
        wait_until("the node agent DaemonSet", agent_ready, READY_TIMEOUT_S)
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n{_diagnose(real_cluster, ns, agent_ns)}")
    all_ready_s = time.monotonic() - start

    def topology() -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = custom.get_cluster_custom_object(
                "dynamiccl.io", "v1alpha1", "nodetopologies", NODE_NAME
            )
        except ApiException:
            return None
        return obj

    wait_until("NodeTopology real-node-0", lambda: topology() is not None, 120)
    topo_s = time.monotonic() - start
    out = _cache_dir() / "logs" / "real-tier-chart.json"
    out.write_text(
        json.dumps({"helm_install_to_all_ready_s": all_ready_s, "to_node_topology_s": topo_s})
    )
    print(
        f"\nhelm install -> operator, ingest, node agent Ready: {all_ready_s:.1f} s;"
        f" NodeTopology: {topo_s:.1f} s"
    )

    # everything runs on the real node; the node agent never restarted (no crash loop)
    time.sleep(20)
    restarts: dict[str, int] = {}
    for name in (ns, agent_ns):
        pods = core.list_namespaced_pod(name)
        assert pods.items, name
        for p in pods.items:
            assert p.spec.node_name == NODE_NAME, p.metadata.name
            assert p.status.phase == "Running", (p.metadata.name, p.status.phase)
        restarts |= _restarts(pods)
    print(f"restarts: {restarts}")
    agent = {k: v for k, v in restarts.items() if "node-agent" in k}
    assert agent, restarts
    assert set(agent.values()) == {0}, agent
    topo = topology() or {}
    print(f"NodeTopology {NODE_NAME}: {json.dumps(topo.get('status', {}))[:800]}")
    assert topo.get("spec") or topo.get("status"), "the node agent published an empty NodeTopology"
