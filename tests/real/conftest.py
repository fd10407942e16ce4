"""Fixtures of the `real` tier: real containers on the real node (hack/real-node.sh).

The session runs ``hack/cluster-up.sh --real-node`` (idempotent: the control plane,
the kwok nodes and the real node; it builds the images with hack/images.sh and
imports them into the node's containerd) and leaves the cluster running at the
end (``make cluster-down`` stops it). The tier needs root (containerd, network
namespaces, iptables); elsewhere it is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# the node's name and what a pod needs to land on it (and only there): the demo's, one copy
from dynamiccl.testing.kubectl import Cluster
from dynamiccl.testing.real_manifests import NODE_NAME
from dynamiccl.testing.real_manifests import chart_values as _chart_values
from dynamiccl.testing.real_node_sessions import SESSION_LABELS, real_tier_lock, remove_leftovers
from dynamiccl.testing.real_release import STORAGE_CLASS, local_store
from dynamiccl.testing.real_release import read_env as _read_env

REPO_ROOT = Path(__file__).resolve().parents[2]
HACK_DIR = REPO_ROOT / "hack"
kubernetes = pytest.importorskip("kubernetes", reason="python 'kubernetes' client not installed")
from kubernetes import client as k8s  # noqa: E402
from kubernetes import config as k8s_config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from tests.chart_releases import drop_other_releases_policies  # noqa: E402

RELEASE = "dynamiccl"
READY_TIMEOUT_S = 300


def _cache_dir() -> Path:
    default = Path.home() / ".cache" / "dynamiccl" / "v1"
    return Path(os.environ.get("DYNAMICCL_CACHE", str(default)))


def _cluster_dir() -> Path:
    return Path(os.environ.get("DYNAMICCL_CLUSTER_DIR", str(_cache_dir() / "cluster")))


@dataclass
class RealCluster:
    kubeconfig: Path
    api: k8s.ApiClient
    helm: Path
    node_dir: Path
    image_repository: str
    image_tag: str

    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api)

    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    def helm_run(self, *args: str, timeout: float = 300) -> str:
        out = subprocess.run(
            [str(self.helm), "--kubeconfig", str(self.kubeconfig), *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert out.returncode == 0, f"helm {' '.join(args)}: {out.stderr}"
        return out.stdout


@pytest.fixture(scope="session")
def real_cluster() -> RealCluster:
    if os.geteuid() != 0:
        pytest.skip("the real node needs root (containerd, network namespaces, iptables)")
    # DYNAMICCL_REAL_REUSE_IMAGES=1: the images last built (no rebuild for a source
    # change; for iterating on the tests themselves)
    steps = [["bash", str(HACK_DIR / "cluster-up.sh"), "--real-node"]]
    if os.environ.get("DYNAMICCL_REAL_REUSE_IMAGES") == "1":
        steps = [
            ["bash", str(HACK_DIR / "cluster-up.sh")],
            ["bash", str(HACK_DIR / "real-node.sh"), "up", "--no-build"],
        ]
    for cmd in steps:
        up = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
        assert up.returncode == 0, f"{' '.join(cmd[1:])} failed:\n{up.stderr[-4000:]}"
    cluster_dir = _cluster_dir()
    kubeconfig = cluster_dir / "kubeconfig"
    api: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    images = _read_env(_cache_dir() / "images" / "images.env")
    return RealCluster(
        kubeconfig=kubeconfig,
        api=api,
        helm=cluster_dir / "bin" / "helm",
        node_dir=cluster_dir / "node",
        image_repository=images["DYNAMICCL_IMAGE_REPOSITORY"],
        image_tag=images["DYNAMICCL_IMAGE_TAG"],
    )


def wait_until(
    what: str, check: Callable[[], bool], timeout: float, interval: float = 1.0
) -> float:
    """Poll `check` until true; the seconds it took. Fails with `what` on timeout."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - start


def namespace_body(name: str, level: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A namespace enforcing (and warning/auditing) Pod Security `level`."""
    ps = {f"pod-security.kubernetes.io/{m}": level for m in ("enforce", "warn", "audit")}
    return {"metadata": {"name": name, "labels": {**ps, **SESSION_LABELS, **(labels or {})}}}


@dataclass
class Release:
    """The chart installed once for the session (restricted release namespace)."""

    namespace: str
    agent_namespace: str
    volume: Path
    ready_s: dict[str, float] = field(default_factory=dict)  # component -> s from helm install

    def operator(self) -> str:
        return f"{RELEASE}-operator"

    def ingest(self) -> str:
        return f"{RELEASE}-ingest"

    def store_db(self) -> Path:
        """The ingest's SQLite store, on the local PersistentVolume of the real node."""
        return self.volume / "experience.db"

    def values_file(self) -> Path:
        """The values the release was installed with. An upgrade passes them with `-f`, never
        `--reuse-values`: their null entries delete chart defaults (the node agent's GPU
        nodeSelector), and helm checks reused nulls against the chart's schema ("got null,
        want string") where `-f` does not."""
        return _cache_dir() / "logs" / f"real-values-{self.namespace}.json"


def chart_values(real_cluster: RealCluster, agent_ns: str) -> dict[str, Any]:
    """The chart's values for the real node: built images, pods on the real node."""
    return _chart_values(
        real_cluster.image_repository, real_cluster.image_tag, agent_ns, STORAGE_CLASS
    )


def delete_topology(real_cluster: RealCluster) -> None:
    """Remove the real node's NodeTopology (one a previous release left must not count)."""
    with contextlib.suppress(ApiException):
        real_cluster.custom().delete_cluster_custom_object(
            "dynamiccl.io", "v1alpha1", "nodetopologies", NODE_NAME
        )


def diagnose(real_cluster: RealCluster, *namespaces: str) -> str:
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


def _wait_ready(real_cluster: RealCluster, rel: Release, start: float) -> None:
    apps: Any = real_cluster.apps()

    def available(name: str) -> bool:
        d = apps.read_namespaced_deployment(name, rel.namespace)
        return (d.status.available_replicas or 0) >= (d.spec.replicas or 1)

    def agent_ready() -> bool:
        ds = apps.read_namespaced_daemon_set(f"{RELEASE}-node-agent", rel.agent_namespace)
        return bool(ds.status.desired_number_scheduled == 1 and ds.status.number_ready == 1)

    checks: dict[str, Callable[[], bool]] = {
        "operator": lambda: available(rel.operator()),
        "ingest": lambda: available(rel.ingest()),
        "node-agent": agent_ready,
    }
    try:
        for name, check in checks.items():
            wait_until(f"the {name}", check, READY_TIMEOUT_S)
            rel.ready_s[name] = time.monotonic() - start
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n{diagnose(real_cluster, rel.namespace, rel.agent_namespace)}")


@contextlib.contextmanager
def tier_lock() -> Iterator[None]:
    """One real-tier session at a time on this cluster (the chart's cluster-scoped objects,
    the webhook and the operator that watches every namespace exist once): the demo's
    exclusive lock on the cluster directory's real-tier.lock, waited for (printing who
    waits; DYNAMICCL_REAL_LOCK_WAIT_S, default 1800 s)."""
    with real_tier_lock(_cluster_dir(), lambda msg: print(msg, flush=True)):
        yield


@pytest.fixture(scope="session")
def release(real_cluster: RealCluster) -> Iterator[Release]:
    """`helm install charts/dynamiccl` once for the session, every component Ready.

    The release namespace enforces Pod Security `restricted`; the node agent, which
    reads the host's /sys and /proc through hostPath volumes, runs in a `privileged`
    namespace of its own (chart value nodeAgent.namespace); the store is a local
    PersistentVolume on the real node. Uninstalled at the end of the session.
    """
    with tier_lock():
        cl = Cluster(str(real_cluster.kubeconfig), real_cluster.helm.parent)
        remove_leftovers(cl, real_cluster.node_dir, lambda msg: print(msg, flush=True))
        yield from _release(real_cluster, cl)


def _release(real_cluster: RealCluster, cl: Cluster) -> Iterator[Release]:
    core: Any = real_cluster.core()
    delete_topology(real_cluster)
    suffix = uuid.uuid4().hex[:6]
    ns, agent_ns = f"dcl-real-{suffix}", f"dcl-real-{suffix}-node"
    core.create_namespace(namespace_body(ns, "restricted"))
    core.create_namespace(namespace_body(agent_ns, "privileged"))
    volume = real_cluster.node_dir / "volumes" / ns
    volume.mkdir(parents=True)
    local_store(cl, ns, volume)
    rel = Release(ns, agent_ns, volume)
    values = rel.values_file()
    values.parent.mkdir(parents=True, exist_ok=True)
    values.write_text(json.dumps(chart_values(real_cluster, agent_ns)))
    try:
        drop_other_releases_policies(real_cluster.api, RELEASE)
        start = time.monotonic()
        real_cluster.helm_run("install", RELEASE, "charts/dynamiccl", "-n", ns, "-f", str(values))
        _wait_ready(real_cluster, rel, start)
        yield rel
    finally:
        with contextlib.suppress(AssertionError):
            real_cluster.helm_run("uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "120s")
        for name in (ns, agent_ns):
            with contextlib.suppress(ApiException):
                core.delete_namespace(name)
        with contextlib.suppress(ApiException):
            core.delete_persistent_volume(f"{ns}-store")
        delete_topology(real_cluster)
        shutil.rmtree(volume, ignore_errors=True)
